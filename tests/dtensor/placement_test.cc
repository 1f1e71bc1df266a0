// Placement: values with ==, hash, PyTorch's repr and short form, and parsing.
#include "dtensor/placement.h"

#include <catch2/catch.hpp>

#include <unordered_set>

#include "core/error.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace dtr {
namespace {

using testing::MessageContains;

TEST_CASE("placements are values: ==, hash, kind queries", "[placement]") {
  CHECK(Shard(0) == Shard(0));
  CHECK(Shard(0) != Shard(1));
  CHECK(Shard(0) != Replicate());
  CHECK(Partial() == Partial(ReduceOp::kSum));
  CHECK(Partial(ReduceOp::kSum) != Partial(ReduceOp::kAvg));
  CHECK(Replicate() == Replicate());

  CHECK(Shard(2).is_shard());
  CHECK(Shard(2).is_shard(2));
  CHECK_FALSE(Shard(2).is_shard(1));
  CHECK(Shard(2).shard_dim() == 2);
  CHECK(Replicate().is_replicate());
  CHECK_FALSE(Replicate().is_shard());
  CHECK(Partial(ReduceOp::kMax).is_partial());
  CHECK(Partial(ReduceOp::kMax).reduce_op() == ReduceOp::kMax);

  const std::unordered_set<Placement> set = {
      Shard(0), Shard(0), Shard(1), Replicate(), Partial(), Partial(), Partial(ReduceOp::kMin)};
  CHECK(set.size() == 5);
  CHECK(set.count(Shard(1)) == 1);
}

TEST_CASE("equal placements hash equal; the distinct ones the suite uses hash apart", "[placement]") {
  const std::hash<Placement> hash;
  const std::vector<Placement> distinct = {Shard(0),
                                           Shard(1),
                                           Shard(2),
                                           Shard(3),
                                           Shard(-1),
                                           Replicate(),
                                           Partial(ReduceOp::kSum),
                                           Partial(ReduceOp::kAvg),
                                           Partial(ReduceOp::kMax),
                                           Partial(ReduceOp::kMin)};
  for (const Placement& a : distinct) {
    INFO(a.repr());
    // The same value made another way: parsed back from its short and long forms.
    CHECK(hash(parse_placement(a.str())) == hash(a));
    CHECK(hash(parse_placement(a.repr())) == hash(a));
    for (const Placement& b : distinct) {
      INFO("vs " << b.repr());
      if (a != b) CHECK(hash(a) != hash(b));
    }
  }
  CHECK(hash(Partial()) == hash(Partial(ReduceOp::kSum)));
}

TEST_CASE("shard_dim and reduce_op of the wrong kind are the caller's ValueError", "[placement][errors]") {
  // A caller's mistake, not a dtr bug: the message names the op and the placement, and says what has one.
  CHECK_THROWS_MATCHES(Replicate().shard_dim(), ValueError,
                       MessageContains("Placement.shard_dim: Replicate() is not a Shard or StridedShard placement") &&
                           MessageContains("only they have a shard dim"));
  CHECK_THROWS_MATCHES(Partial(ReduceOp::kAvg).shard_dim(), ValueError, MessageContains("Partial(avg)"));
  CHECK_THROWS_MATCHES(Shard(1).reduce_op(), ValueError,
                       MessageContains("Placement.reduce_op: Shard(dim=1) is not a Partial placement") &&
                           MessageContains("only Partial(op) has a reduce op"));
  CHECK_THROWS_MATCHES(Replicate().reduce_op(), ValueError, MessageContains("Replicate()"));
}

TEST_CASE("repr and short form follow PyTorch", "[placement]") {
  CHECK(Shard(0).repr() == "Shard(dim=0)");
  CHECK(Replicate().repr() == "Replicate()");
  CHECK(Partial().repr() == "Partial(sum)");
  CHECK(Partial(ReduceOp::kAvg).repr() == "Partial(avg)");
  CHECK(Shard(1).str() == "S(1)");
  CHECK(Replicate().str() == "R");
  CHECK(Partial(ReduceOp::kMax).str() == "P(max)");
  CHECK(fmt::format("{}", Partial(ReduceOp::kMin)) == "P(min)");
  CHECK(placements_str({Shard(0), Replicate(), Partial()}) == "(S(0), R, P(sum))");
  CHECK(StridedShard(0, 3).repr() == "StridedShard(dim=0, split_factor=3)");
  CHECK(StridedShard(1, 2).str() == "SS(1,2)");
}

TEST_CASE("StridedShard: a split factor of 1 is a Shard; it is not a Shard otherwise", "[placement][strided]") {
  CHECK(StridedShard(2, 1) == Shard(2));
  const Placement ss = StridedShard(0, 3);
  CHECK(ss.is_strided_shard());
  CHECK_FALSE(ss.is_shard());
  CHECK(ss.splits_dim(0));
  CHECK_FALSE(ss.splits_dim(1));
  CHECK(Shard(1).splits_dim(1));
  CHECK(ss.shard_dim() == 0);
  CHECK(ss.split_factor() == 3);
  CHECK(Shard(0).split_factor() == 1);
  CHECK(ss != StridedShard(0, 2));
  CHECK(ss.hash() != StridedShard(0, 2).hash());
  CHECK_THROWS_MATCHES(StridedShard(0, 0), ValueError, MessageContains("split_factor=0") && MessageContains(">= 1"));
  CHECK_THROWS_MATCHES(Replicate().split_factor(), ValueError, MessageContains("Replicate()"));
}

TEST_CASE("parse_placement reads the short, CLI and repr forms", "[placement]") {
  CHECK(parse_placement("S(0)") == Shard(0));
  CHECK(parse_placement("S1") == Shard(1));
  CHECK(parse_placement(" Shard(dim=2) ") == Shard(2));
  CHECK(parse_placement("S-1") == Shard(-1));
  CHECK(parse_placement("R") == Replicate());
  CHECK(parse_placement("Replicate()") == Replicate());
  CHECK(parse_placement("P") == Partial());
  CHECK(parse_placement("P(avg)") == Partial(ReduceOp::kAvg));
  CHECK(parse_placement("Pmax") == Partial(ReduceOp::kMax));
  CHECK(parse_placement("Partial(min)") == Partial(ReduceOp::kMin));
  CHECK(parse_placements("S0,R") == Placements{Shard(0), Replicate()});
  CHECK(parse_placements("S(0), P(sum), Shard(dim=1)") == Placements{Shard(0), Partial(), Shard(1)});
  CHECK(parse_placement("SS(0,3)") == StridedShard(0, 3));
  CHECK(parse_placement("StridedShard(dim=1, split_factor=2)") == StridedShard(1, 2));
  CHECK(parse_placements("SS(0,3), S0") == Placements{StridedShard(0, 3), Shard(0)});
  for (const Placement& p : {Shard(3), StridedShard(0, 4), Replicate(), Partial(ReduceOp::kAvg)}) {
    CHECK(parse_placement(p.str()) == p);
    CHECK(parse_placement(p.repr()) == p);
  }
}

TEST_CASE("parse_placement rejects malformed text, naming it and the legal forms", "[placement][errors]") {
  for (const char* bad :
       {"", "X", "S", "S(x)", "S(0", "Sx0", "R(1)", "P(prod)", "Pfoo", "Shard(dim=)", "SS(0)", "SS(0,x)", "SS(0,3"}) {
    INFO(bad);
    CHECK_THROWS_MATCHES(parse_placement(bad), ValueError,
                         MessageContains(fmt::format("'{}'", bad)) && MessageContains("S(0), S0, Shard(dim=0), R"));
  }
  CHECK_THROWS_MATCHES(parse_placements("S0,,R"), ValueError, MessageContains("cannot read ''"));
  // Empty parentheses name no reduce op (P alone is P(sum)).
  for (const char* bad : {"P()", "Partial()"}) {
    CHECK_THROWS_MATCHES(parse_placement(bad), ValueError,
                         MessageContains(fmt::format("'{}' names no reduce op", bad)) &&
                             MessageContains("P or P(sum)") && MessageContains("P(avg), P(max), P(min)"));
  }
}

}  // namespace
}  // namespace dtr
