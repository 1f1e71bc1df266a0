// Redistribute planner: the classic transitions, bytes worked out by hand, seeded random
// plans checked against an independent model of what each rank holds, coalescing, the
// errors, and explain().
#include "dtensor/redistribute_plan.h"

#include <catch2/catch.hpp>

#include <limits>
#include <set>

#include "core/error.h"
#include "dtensor/explain.h"
#include "kernels/block_reduce.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace dtr {
namespace {

using testing::MessageContains;

struct ExpectedStep {
  int64_t mesh_dim;
  Placement from;
  Placement to;
  StepOp op;
  int64_t num_mesh_dims = 1;  // more for a merged collective
};

void check_steps(const RedistributePlan& plan, const std::vector<ExpectedStep>& expected) {
  INFO(explain_plan(plan));
  REQUIRE(plan.steps().size() == expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    INFO("step " << k + 1);
    CHECK(plan.steps()[k].mesh_dim == expected[k].mesh_dim);
    CHECK(plan.steps()[k].num_mesh_dims == expected[k].num_mesh_dims);
    CHECK(plan.steps()[k].from == expected[k].from);
    CHECK(plan.steps()[k].to == expected[k].to);
    CHECK(step_op_name(plan.steps()[k].op) == step_op_name(expected[k].op));
  }
}

RedistributePlan plan(Shape mesh_shape, Placements from, Placements to, Shape shape = {8, 6, 4}) {
  return plan_redistribute(DTensorSpec(testing::make_mesh(std::move(mesh_shape)), std::move(from), shape, kFloat32),
                           to);
}

TEST_CASE("one mesh dim: each transition is one step with its collective", "[redistribute]") {
  const ReduceOp sum = ReduceOp::kSum, avg = ReduceOp::kAvg;
  check_steps(plan({4}, {Shard(0)}, {Replicate()}), {{0, Shard(0), Replicate(), StepOp::kAllGather}});
  check_steps(plan({4}, {Partial(sum)}, {Shard(0)}), {{0, Partial(sum), Shard(0), StepOp::kReduceScatter}});
  check_steps(plan({4}, {Partial(avg)}, {Replicate()}), {{0, Partial(avg), Replicate(), StepOp::kAllReduce}});
  check_steps(plan({4}, {Replicate()}, {Shard(1)}), {{0, Replicate(), Shard(1), StepOp::kChunk}});
  check_steps(plan({4}, {Shard(0)}, {Shard(1)}), {{0, Shard(0), Shard(1), StepOp::kAllToAll}});
  check_steps(plan({4}, {Replicate()}, {Partial(sum)}), {{0, Replicate(), Partial(sum), StepOp::kPartition}});
  check_steps(plan({4}, {Replicate()}, {Partial(ReduceOp::kMax)}),
              {{0, Replicate(), Partial(ReduceOp::kMax), StepOp::kRelabel}});
  // Shard -> Partial(sum|max|min) is local; avg goes through Replicate (a scaled pad would not be exact).
  check_steps(plan({4}, {Shard(2)}, {Partial(sum)}), {{0, Shard(2), Partial(sum), StepOp::kPad}});
  check_steps(plan({4}, {Shard(0)}, {Partial(ReduceOp::kMin)}), {{0, Shard(0), Partial(ReduceOp::kMin), StepOp::kPad}});
  check_steps(plan({4}, {Shard(1)}, {Partial(avg)}),
              {{0, Shard(1), Replicate(), StepOp::kAllGather}, {0, Replicate(), Partial(avg), StepOp::kRelabel}});
  check_steps(plan({4}, {Shard(1)}, {Shard(1)}), {});
  check_steps(plan({4}, {Partial(avg)}, {Partial(avg)}), {});
  check_steps(plan({4}, {Replicate()}, {Replicate()}), {});
  check_steps(plan({1}, {Shard(0)}, {Replicate()}), {{0, Shard(0), Replicate(), StepOp::kRelabel}});
  CHECK(plan({1}, {Partial(sum)}, {Replicate()}).num_collectives() == 0);
}

TEST_CASE("N-D meshes: greedy passes, the cheapest order, merged collectives", "[redistribute][nested]") {
  // Nested sharding on mesh dim 1 must be undone before mesh dim 0 can gather: both
  // gathers run as one over the flattened mesh, moving the same bytes with one latency.
  check_steps(plan({2, 2}, {Shard(0), Shard(0)}, {Replicate(), Shard(0)}),
              {{0, Shard(0), Replicate(), StepOp::kAllGather, 2}, {1, Replicate(), Shard(0), StepOp::kChunk}});
  // PyTorch #131210: a single all_to_all, not two all_gathers.
  check_steps(plan({2, 2}, {Shard(1), Shard(1)}, {Shard(1), Shard(2)}), {{1, Shard(1), Shard(2), StepOp::kAllToAll}});
  // Inner dims first: the chunk on mesh dim 1 shrinks what mesh dim 0 gathers.
  check_steps(plan({2, 2}, {Shard(0), Replicate()}, {Replicate(), Shard(1)}),
              {{1, Replicate(), Shard(1), StepOp::kChunk}, {0, Shard(0), Replicate(), StepOp::kAllGather}});
  check_steps(plan({2, 2}, {Shard(0), Shard(1)}, {Shard(1), Shard(0)}), {{1, Shard(1), Replicate(), StepOp::kAllGather},
                                                                         {0, Shard(0), Shard(1), StepOp::kAllToAll},
                                                                         {1, Replicate(), Shard(0), StepOp::kChunk}});
  // Both reductions scatter, as one reduce_scatter over the flattened mesh.
  check_steps(plan({2, 2}, {Partial(), Partial()}, {Shard(0), Shard(0)}),
              {{0, Partial(), Shard(0), StepOp::kReduceScatter, 2}});
  check_steps(plan({2, 2}, {Partial(), Partial()}, {Replicate(), Replicate()}),
              {{0, Partial(), Replicate(), StepOp::kAllReduce, 2}});
  // HSDP's gradient move: reduce-scatter on the shard dim, then all-reduce the shard on
  // the replica dim (PyTorch's order would all-reduce the whole gradient first).
  check_steps(plan({2, 4}, {Partial(), Partial()}, {Replicate(), Shard(0)}),
              {{1, Partial(), Shard(0), StepOp::kReduceScatter}, {0, Partial(), Replicate(), StepOp::kAllReduce}});
  // R -> P waits until the old Partial is reduced: no (P(sum), P(max)) in between.
  check_steps(
      plan({2, 2}, {Replicate(), Partial(ReduceOp::kMax)}, {Partial(), Replicate()}),
      {{1, Partial(ReduceOp::kMax), Replicate(), StepOp::kAllReduce}, {0, Replicate(), Partial(), StepOp::kPartition}});
  check_steps(plan({2, 2, 2}, {Shard(0), Shard(0), Shard(0)}, {Replicate(), Shard(0), Shard(0)}),
              {{0, Shard(0), Replicate(), StepOp::kAllGather, 3},
               {1, Replicate(), Shard(0), StepOp::kChunk},
               {2, Replicate(), Shard(0), StepOp::kChunk}});
  // Shard -> Partial pads in place: one all_gather where going through Replicate takes two.
  check_steps(plan({2, 2}, {Shard(0), Shard(0)}, {Replicate(), Partial()}),
              {{1, Shard(0), Partial(), StepOp::kPad}, {0, Shard(0), Replicate(), StepOp::kAllGather}});
  // The pad comes last when an all_reduce on another mesh dim can run on the shard first.
  check_steps(plan({2, 2}, {Partial(), Shard(0)}, {Replicate(), Partial()}),
              {{0, Partial(), Replicate(), StepOp::kAllReduce}, {1, Shard(0), Partial(), StepOp::kPad}});
}

TEST_CASE("Shard -> Partial is local for sum, max and min", "[redistribute][partial]") {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    for (const Shape& mesh : {Shape{4}, Shape{2, 3}}) {
      const RedistributePlan p =
          plan(mesh, Placements(mesh.size(), Shard(0)), Placements(mesh.size(), Partial(op)), {5, 3});
      INFO(explain_plan(p));
      CHECK(p.num_collectives() == 0);
      CHECK(p.max_send_bytes() == 0);
      for (const RedistributeStep& s : p.steps()) CHECK(s.op == StepOp::kPad);
    }
  }
  // Two mesh dims sharding dim 0 -> (R, P): the inner one pads, the outer one gathers once.
  const RedistributePlan p = plan({2, 2}, {Shard(0), Shard(0)}, {Replicate(), Partial()}, {8, 6});
  CHECK(p.num_collectives() == 1);
  // The gather moves the padded half of the tensor: one block of 4x6 floats.
  CHECK(p.total_send_bytes() == std::vector<int64_t>{96, 96, 96, 96});
  CHECK_THAT(explain_plan(p),
             Catch::Matchers::Contains("pad (local: each rank's shard at its offset, zeros elsewhere)"));
  CHECK_THAT(explain_plan(plan({4}, {Shard(0)}, {Partial(ReduceOp::kMax)})),
             Catch::Matchers::Contains("the lowest value elsewhere") && Catch::Matchers::Contains("no communication"));
}

TEST_CASE("collectives on adjacent mesh dims merge over the flattened group", "[redistribute][merged]") {
  const DeviceMesh mesh = testing::make_mesh({2, 2}, {"dp", "tp"});
  // Even: one collective of each kind, bytes per rank no higher than the two-step plan's.
  struct Move {
    Placements from, to;
    StepOp op;
  };
  for (const Move& m : {Move{{Shard(0), Shard(0)}, {Replicate(), Replicate()}, StepOp::kAllGather},
                        Move{{Partial(), Partial()}, {Replicate(), Replicate()}, StepOp::kAllReduce},
                        Move{{Partial(), Partial()}, {Shard(0), Shard(0)}, StepOp::kReduceScatter}}) {
    const DTensorSpec spec(mesh, m.from, {8, 6}, kFloat32);
    const std::vector<RedistributePlan> alternatives = plan_alternatives(spec, m.to);
    const RedistributePlan chosen = plan_redistribute(spec, m.to);
    INFO(explain_alternatives(alternatives));
    REQUIRE(chosen.steps().size() == 1);
    CHECK(chosen.steps()[0].op == m.op);
    CHECK(chosen.steps()[0].num_mesh_dims == 2);
    for (const RedistributePlan& alt : alternatives) {
      const std::vector<int64_t> mine = chosen.total_send_bytes(), theirs = alt.total_send_bytes();
      for (size_t r = 0; r < mine.size(); ++r) CHECK(mine[r] <= theirs[r]);
    }
  }
  // An all_reduce over 4 ranks moves 2*3/4 of the tensor; two over 2 ranks move 2*(1/2 + 1/2).
  CHECK(plan({2, 2}, {Partial(), Partial()}, {Replicate(), Replicate()}, {8, 6}).max_send_bytes() == 288);
  CHECK(plan({2, 2, 2}, {Shard(1), Shard(1), Shard(1)}, Placements(3, Replicate()), {3, 8}).num_collectives() == 1);

  // Uneven, merged: 7 rows nest over 2x2 as 2,2,2,1, the flattened group's own chunks, so
  // the merged gather moves what the two gathers move.
  const RedistributePlan seven = plan({2, 2}, {Shard(0), Shard(0)}, {Replicate(), Replicate()}, {7, 3});
  REQUIRE(seven.steps().size() == 1);
  CHECK(seven.total_send_bytes() == std::vector<int64_t>{72, 72, 72, 72});
  // Uneven, not merged: 5 rows nest as 2,1,1,1; one gather over 4 ranks pads every block to
  // 2 rows (72 B each) where two gathers send 60 and 48 B.
  const DTensorSpec five(mesh, {Shard(0), Shard(0)}, {5, 3}, kFloat32);
  const RedistributePlan chosen = plan_redistribute(five, {Replicate(), Replicate()});
  CHECK(chosen.num_collectives() == 2);
  CHECK(chosen.total_send_bytes() == std::vector<int64_t>{60, 60, 48, 48});
  CHECK_FALSE(explain_plan(chosen).find("merged") != std::string::npos);
  const std::vector<RedistributePlan> alternatives = plan_alternatives(five, {Replicate(), Replicate()});
  REQUIRE(alternatives.size() == 2);
  CHECK(alternatives[0].num_collectives() == 1);
  CHECK(alternatives[0].max_send_bytes() == 72);
  const std::string why = explain_alternatives(alternatives);
  CHECK_THAT(why, Catch::Matchers::Contains("2 plans considered for float32[5, 3] (S(0), S(0))") &&
                      Catch::Matchers::Contains("plan 2 (chosen): unshard over mesh dims (1, 0), then (0, 1)") &&
                      Catch::Matchers::Contains("chosen: plan 2: the fewest bytes sent by the busiest rank (60 "
                                                "against 72)"));
  CHECK_THAT(explain_plan(plan_redistribute(DTensorSpec(mesh, {Shard(0), Shard(0)}, {8, 6}, kFloat32),
                                            {Replicate(), Replicate()})),
             Catch::Matchers::Contains("step 1: mesh dims 0-1 (dp, tp): S(0) -> R, all_gather over groups [[0, 1, 2, "
                                       "3]] (merged: one collective over the 2 mesh dims flattened, instead of 2)"));
}

TEST_CASE("bytes per rank, even and uneven, worked out by hand", "[redistribute][bytes]") {
  using Bytes = std::vector<int64_t>;
  // float32 [8, 6] S(0) -> R on 4 ranks: shards of 2x6 = 48 B; each rank sends its shard to
  // 3 peers and receives 3 shards.
  RedistributePlan even = plan({4}, {Shard(0)}, {Replicate()}, {8, 6});
  CHECK(even.steps()[0].send_bytes == Bytes{144, 144, 144, 144});
  CHECK(even.steps()[0].recv_bytes == Bytes{144, 144, 144, 144});
  // [10, 6]: rows 3,3,3,1, padded to 3 rows = 72 B per block; 3 blocks each way.
  RedistributePlan uneven = plan({4}, {Shard(0)}, {Replicate()}, {10, 6});
  CHECK(uneven.total_send_bytes() == Bytes{216, 216, 216, 216});
  CHECK(uneven.total_recv_bytes() == Bytes{216, 216, 216, 216});
  // P -> S(0) on [8, 6]: blocks of 2x6 = 48 B, 3 out and 3 in.
  CHECK(plan({4}, {Partial()}, {Shard(0)}, {8, 6}).total_send_bytes() == Bytes{144, 144, 144, 144});
  // P -> R on [8, 6] = 48 elements: 2 * 3 * 12 elements = 288 B each way.
  CHECK(plan({4}, {Partial()}, {Replicate()}, {8, 6}).total_recv_bytes() == Bytes{288, 288, 288, 288});
  // S(0) -> S(1) on [8, 6]: blocks of 2 rows x ceil(6/4) = 2 cols = 16 B, 3 each way.
  CHECK(plan({4}, {Shard(0)}, {Shard(1)}, {8, 6}).total_send_bytes() == Bytes{48, 48, 48, 48});
  // Local moves cost nothing.
  CHECK(plan({4}, {Replicate()}, {Shard(0)}, {8, 6}).total_send_bytes() == Bytes{0, 0, 0, 0});
  CHECK(plan({4}, {Replicate()}, {Partial()}, {8, 6}).total_recv_bytes() == Bytes{0, 0, 0, 0});
  // (S(0), S(0)) -> (R, S(0)) on 2x2, float32 [5, 6]. Mesh dim 0 gives rows 3 and 2.
  // Step 1 (mesh dim 1 gathers): rows 3 -> blocks of 2 rows (48 B), rows 2 -> 1 row (24 B).
  // Step 2 (mesh dim 0 gathers all 5 rows): blocks of 3 rows = 72 B. Step 3 is local.
  RedistributePlan nested = plan({2, 2}, {Shard(0), Shard(0)}, {Replicate(), Shard(0)}, {5, 6});
  CHECK(nested.steps()[0].send_bytes == Bytes{48, 48, 24, 24});
  CHECK(nested.steps()[1].send_bytes == Bytes{72, 72, 72, 72});
  CHECK(nested.total_recv_bytes() == Bytes{120, 120, 96, 96});
  // bfloat16 halves everything.
  const DTensorSpec bf16(testing::make_mesh({4}), {Shard(0)}, {10, 6}, kBFloat16);
  CHECK(plan_redistribute(bf16, {Replicate()}).total_send_bytes() == Bytes{108, 108, 108, 108});
}

// ---- property tests: an independent model of what every rank holds --------------------

// The mesh positions of the group of mesh dims [first, first + count) through position k,
// row-major over those dims.
std::vector<int64_t> group_of(const DeviceMesh& mesh, int64_t first, int64_t count, int64_t k) {
  const std::vector<int64_t> coord = mesh.coordinate_at(k);
  std::vector<int64_t> group;
  for (int64_t index = 0; index < mesh.size(); ++index) {
    const std::vector<int64_t> other = mesh.coordinate_at(index);
    bool same = true;
    for (int64_t i = 0; i < mesh.ndim(); ++i) same &= (i >= first && i < first + count) || other[i] == coord[i];
    if (same) group.push_back(index);  // row-major over the mesh is row-major over the range
  }
  return group;
}

// True when the chunks lie end to end along dim d in order and, together, make `whole`.
bool concatenate_to(const std::vector<LocalChunk>& parts, int64_t d, const LocalChunk& whole) {
  int64_t next = whole.offset[d];
  for (const LocalChunk& p : parts) {
    for (size_t e = 0; e < whole.shape.size(); ++e) {
      if (static_cast<int64_t>(e) == d) continue;
      if (p.offset[e] != whole.offset[e] || p.shape[e] != whole.shape[e]) return false;
    }
    if (p.offset[d] != next && p.shape[d] != 0) return false;
    next += p.shape[d];
  }
  return next == whole.offset[d] + whole.shape[d];
}

int64_t numel_except(const Shape& shape, std::set<int64_t> skip) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!skip.count(static_cast<int64_t>(d))) n *= shape[d];
  }
  return n;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Checks that `step` is a legal single-mesh-dim move for the tensor `spec`: the data
// each group holds before makes, by the step's op, exactly the chunks the placements after
// it say; and that its bytes are what padded blocks of that data weigh.
void check_step(const DTensorSpec& spec, const RedistributeStep& step) {
  const DeviceMesh& mesh = spec.mesh();
  const int64_t first = step.mesh_dim, count = step.num_mesh_dims;
  int64_t n = 1;
  for (int64_t i = first; i < first + count; ++i) n *= mesh.shape()[i];
  const int64_t item = static_cast<int64_t>(itemsize(spec.dtype()));
  INFO("step " << step.from.str() << " -> " << step.to.str() << " on mesh dims [" << first << ", " << first + count
               << ") (" << step_op_name(step.op) << ") from " << placements_str(step.before));
  for (int64_t j = 0; j < mesh.ndim(); ++j) {
    const bool moved = j >= first && j < first + count;
    REQUIRE(step.before[j] == (moved ? step.from : step.after[j]));
    if (moved) REQUIRE(step.after[j] == step.to);
  }
  REQUIRE(step.from != step.to);
  CHECK_FALSE((step.from.is_shard() && step.to == Partial(ReduceOp::kAvg)));
  CHECK_FALSE((step.from.is_partial() && step.to.is_partial()));
  if (count > 1) CHECK(is_collective(step.op));
  // Every intermediate placement list is a valid spec (no non-commuting Partial mix).
  CHECK_NOTHROW(spec.with_placements(step.after));

  const char* expected_op = n == 1                                         ? "relabel"
                            : step.from.is_shard() && step.to.is_shard()   ? "all_to_all"
                            : step.from.is_shard() && step.to.is_partial() ? "pad"
                            : step.from.is_shard()                         ? "all_gather"
                            : step.from.is_partial() && step.to.is_shard() ? "reduce_scatter"
                            : step.from.is_partial()                       ? "all_reduce"
                            : step.to.is_shard()                           ? "chunk"
                            : step.to.reduce_op() == ReduceOp::kSum        ? "partition"
                                                                           : "relabel";
  CHECK(step_op_name(step.op) == expected_op);

  const Shape& shape = spec.shape();
  int64_t sent = 0, received = 0;
  for (int64_t k = 0; k < mesh.size(); ++k) {
    const std::vector<int64_t> group = group_of(mesh, first, count, k);
    std::vector<LocalChunk> before, after;
    for (int64_t g : group) {
      before.push_back(testing::reference_chunk(mesh.shape(), step.before, shape, mesh.coordinate_at(g)));
      after.push_back(testing::reference_chunk(mesh.shape(), step.after, shape, mesh.coordinate_at(g)));
    }
    const size_t me = std::find(group.begin(), group.end(), k) - group.begin();
    const LocalChunk& mine_before = before[me];
    const LocalChunk& mine_after = after[me];
    // The group's piece: what the members hold together before (Shard) or each (else).
    LocalChunk piece = mine_before;
    if (step.from.is_shard()) {
      const int64_t d = step.from.shard_dim();
      piece.offset[d] = before.front().offset[d];
      piece.shape[d] = 0;
      for (const LocalChunk& b : before) piece.shape[d] += b.shape[d];
      CHECK(concatenate_to(before, d, piece));
    } else {
      for (const LocalChunk& b : before) CHECK(b == mine_before);
    }
    if (step.to.is_shard()) {
      CHECK(concatenate_to(after, step.to.shard_dim(), piece));
    } else {
      CHECK(mine_after == piece);
    }

    int64_t elements = 0;
    if (n > 1) {
      if (step.op == StepOp::kAllGather) {
        const int64_t d = step.from.shard_dim();
        // Receives every other member's shard, each padded to ceil(piece/n) rows.
        const int64_t block = ceil_div(piece.shape[d], n) * numel_except(piece.shape, {d});
        elements = (n - 1) * block;
        int64_t real = 0;
        for (size_t g = 0; g < group.size(); ++g) {
          if (group[g] != k) real += shape_numel(before[g].shape);
        }
        CHECK(real <= elements);
        if (piece.shape[d] % n == 0) CHECK(real == elements);
      } else if (step.op == StepOp::kReduceScatter) {
        const int64_t d = step.to.shard_dim();
        elements = (n - 1) * ceil_div(piece.shape[d], n) * numel_except(piece.shape, {d});
        if (piece.shape[d] % n == 0) CHECK(elements == (n - 1) * shape_numel(mine_after.shape));
      } else if (step.op == StepOp::kAllToAll) {
        const int64_t a = step.from.shard_dim(), b = step.to.shard_dim();
        elements =
            (n - 1) * ceil_div(piece.shape[a], n) * ceil_div(piece.shape[b], n) * numel_except(piece.shape, {a, b});
      } else if (step.op == StepOp::kAllReduce) {
        elements = 2 * (n - 1) * ceil_div(shape_numel(piece.shape), n);
      }
    }
    CHECK(step.send_bytes[k] >= 0);
    CHECK(step.recv_bytes[k] == elements * item);
    CHECK(step.send_bytes[k] == elements * item);
    sent += step.send_bytes[k];
    received += step.recv_bytes[k];
  }
  CHECK(sent == received);  // every byte sent is received somewhere
}

// Steps that move a mesh dim already at its target are only allowed to undo nesting:
// Shard(d) -> Replicate where earlier mesh dims shard d differently than the target.
void check_no_needless_moves(const RedistributePlan& plan) {
  const Placements& target = plan.target_placements();
  std::vector<int> moves(target.size(), 0);
  for (const RedistributeStep& s : plan.steps()) {
    for (int64_t i = s.mesh_dim; i < s.mesh_dim + s.num_mesh_dims; ++i) {
      ++moves[i];
      if (s.before[i] != target[i]) continue;
      INFO("mesh dim " << i << " already at " << target[i].str() << " moved in " << placements_str(s.before));
      REQUIRE(s.from.is_shard());
      CHECK(s.to.is_replicate());
      const int64_t d = s.from.shard_dim();
      bool misaligned = false;
      for (int64_t j = 0; j < i; ++j) misaligned |= s.before[j].is_shard(d) != target[j].is_shard(d);
      CHECK(misaligned);
    }
  }
  for (int m : moves) CHECK(m <= 2);  // at most: to Replicate, then to the target
}

// The plan's steps chain from the source to `target`, each a legal move (check_step).
void check_chain(const DTensorSpec& spec, const RedistributePlan& plan, const Placements& target) {
  Placements current = spec.placements();
  for (const RedistributeStep& s : plan.steps()) {
    REQUIRE(s.before == current);
    check_step(spec, s);
    current = s.after;
  }
  CHECK(current == target);
}

bool same_steps(const RedistributePlan& a, const RedistributePlan& b) {
  if (a.steps().size() != b.steps().size()) return false;
  for (size_t k = 0; k < a.steps().size(); ++k) {
    const RedistributeStep &x = a.steps()[k], &y = b.steps()[k];
    if (x.mesh_dim != y.mesh_dim || x.from != y.from || x.to != y.to || x.op != y.op || x.before != y.before ||
        x.after != y.after || x.send_bytes != y.send_bytes || x.recv_bytes != y.recv_bytes) {
      return false;
    }
  }
  return true;
}

TEST_CASE("random plans reach the target through legal steps with consistent bytes", "[redistribute][property]") {
  std::mt19937_64 gen(7);
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
  const std::vector<DType> dtypes = {kFloat32, kBFloat16, kFloat64, kInt32};
  int64_t planned = 0, rejected = 0, nested = 0, merged = 0;
  for (int round = 0; planned < 400; ++round) {
    const Shape& mesh_shape = testing::test_mesh_shapes()[round % testing::test_mesh_shapes().size()];
    const DeviceMesh mesh = testing::make_mesh(mesh_shape);
    const Shape shape = testing::random_shape(gen);
    const ReduceOp src_op = ops[gen() % ops.size()], dst_op = ops[gen() % ops.size()];
    const Placements src = testing::random_placements(gen, mesh.ndim(), shape.size(), src_op);
    const Placements dst = testing::random_placements(gen, mesh.ndim(), shape.size(), dst_op);
    const DType dtype = dtypes[round % dtypes.size()];
    const auto averages = [](const Placements& p) { return std::count(p.begin(), p.end(), Partial(ReduceOp::kAvg)); };
    if (!is_floating(dtype) && averages(src) + averages(dst) > 0) {
      // An integer Partial(avg) is refused when its spec is made, source or target.
      if (averages(src) > 0) {
        CHECK_THROWS_MATCHES(DTensorSpec(mesh, src, shape, dtype), TypeError, MessageContains("Partial(avg)"));
      } else if (DTensorSpec::is_valid(mesh, src, shape, dtype)) {
        CHECK_THROWS_AS(plan_redistribute(DTensorSpec(mesh, src, shape, dtype), dst), TypeError);
      }
      ++rejected;
      continue;
    }
    const DTensorSpec spec(mesh, src, shape, dtype);
    INFO("case " << round << ": " << spec.to_string() << " -> " << placements_str(dst));
    bool changes_partial_op = false;
    for (size_t i = 0; i < src.size(); ++i) {
      changes_partial_op |= src[i].is_partial() && dst[i].is_partial() && src[i] != dst[i];
    }
    if (changes_partial_op) {
      CHECK_THROWS_MATCHES(plan_redistribute(spec, dst), ValueError, MessageContains("cannot change its reduce op"));
      ++rejected;
      continue;
    }
    const RedistributePlan p = plan_redistribute(spec, dst);
    INFO(explain_plan(p));
    check_chain(spec, p, dst);
    CHECK(p.target_placements() == dst);
    check_no_needless_moves(p);
    // Every alternative is a legal plan too, and none moves fewer bytes.
    const std::vector<RedistributePlan> alternatives = plan_alternatives(spec, dst);
    REQUIRE(!alternatives.empty());
    CHECK(same_steps(p, alternatives[best_plan_index(alternatives)]));
    for (const RedistributePlan& alt : alternatives) {
      INFO("alternative: " << alt.strategy() << "\n" << explain_plan(alt));
      check_chain(spec, alt, dst);
      CHECK(p.max_send_bytes() <= alt.max_send_bytes());
      merged += std::any_of(alt.steps().begin(), alt.steps().end(),
                            [](const RedistributeStep& s) { return s.num_mesh_dims > 1; });
    }
    // Totals are the sums over steps; planning is deterministic.
    std::vector<int64_t> send(mesh.size(), 0);
    for (const RedistributeStep& s : p.steps()) {
      for (int64_t k = 0; k < mesh.size(); ++k) send[k] += s.send_bytes[k];
    }
    CHECK(p.total_send_bytes() == send);
    CHECK(same_steps(p, plan_redistribute(spec, dst)));
    for (int64_t d = 0; d < spec.ndim(); ++d) nested += spec.mesh_dims_sharding(d).size() > 1;
    ++planned;
  }
  CHECK(rejected > 0);
  CHECK(nested > 0);
  CHECK(merged > 0);
}

TEST_CASE("under --deterministic every plan sums a Partial's mesh dims innermost first", "[redistribute][property]") {
  // keep_tree_order's invariant on every move between Shard(0), Shard(1), Replicate and a sum
  // Partial on 2 x 2, 2 x 3, 3 x 2 and 2 x 2 x 2 meshes: the steps that sum (all_reduce,
  // reduce_scatter from a Partial) come innermost mesh dims first, and the plans still reach
  // their targets through legal steps. The plain planner reduce-scatters first, outer dims too.
  const std::vector<Placement> kinds = {Shard(0), Shard(1), Replicate(), Partial()};
  set_deterministic_block_tokens(1);
  int64_t plans = 0, several = 0;
  for (const Shape& mesh_shape : std::vector<Shape>{{2, 2}, {2, 3}, {3, 2}, {2, 2, 2}}) {
    const DeviceMesh mesh = testing::make_mesh(mesh_shape);
    const auto n = static_cast<int64_t>(mesh_shape.size());
    int64_t combos = 1;
    for (int64_t d = 0; d < n; ++d) combos *= 4;
    auto placements = [&](int64_t code) {
      Placements p;
      for (int64_t d = 0; d < n; ++d, code /= 4) p.push_back(kinds[static_cast<size_t>(code % 4)]);
      return p;
    };
    for (int64_t from = 0; from < combos; ++from) {
      for (int64_t to = 0; to < combos; ++to) {
        const DTensorSpec spec(mesh, placements(from), {12, 12}, kFloat32);
        const Placements dst = placements(to);
        INFO(spec.to_string() << " -> " << placements_str(dst));
        const RedistributePlan p = plan_redistribute(spec, dst);
        check_chain(spec, p, dst);
        std::vector<const RedistributeStep*> sums;
        for (const RedistributeStep& s : p.steps()) {
          if (s.from.is_partial() && (s.op == StepOp::kAllReduce || s.op == StepOp::kReduceScatter)) sums.push_back(&s);
        }
        ++plans;
        several += sums.size() > 1;
        for (size_t k = 1; k < sums.size(); ++k) {
          INFO(explain_plan(p));
          CHECK(sums[k]->mesh_dim + sums[k]->num_mesh_dims <= sums[k - 1]->mesh_dim);
        }
      }
    }
  }
  set_deterministic_block_tokens(0);
  CHECK(plans == 3 * 256 + 4096);
  CHECK(several > 100);
}

TEST_CASE("coalesced plans: the same steps, bytes summed over the tensors", "[redistribute][coalesced]") {
  const DeviceMesh mesh = testing::make_mesh({2, 2}, {"dp", "tp"});
  const std::vector<DTensorSpec> specs = {
      DTensorSpec(mesh, {Shard(0), Shard(0)}, {5, 6}, kFloat32),
      DTensorSpec(mesh, {Shard(0), Shard(0)}, {3}, kBFloat16),
      DTensorSpec(mesh, {Shard(0), Shard(0)}, {0, 4}, kFloat64),
  };
  const Placements target = {Replicate(), Shard(0)};
  const RedistributePlan coalesced = plan_redistribute_coalesced(specs, target);
  CHECK(coalesced.sources().size() == 3);
  // Each tensor's alternatives hold the coalesced steps; their bytes add up to the coalesced ones.
  std::vector<std::vector<RedistributePlan>> per_tensor;
  for (const DTensorSpec& s : specs) per_tensor.push_back(plan_alternatives(s, target));
  const size_t candidates = per_tensor[0].size();
  int64_t best_sum = std::numeric_limits<int64_t>::max();
  int matched = 0;
  for (size_t c = 0; c < candidates; ++c) {
    std::vector<int64_t> sum(mesh.size(), 0);
    for (const auto& alts : per_tensor) {
      REQUIRE(alts.size() == candidates);
      for (int64_t r = 0; r < mesh.size(); ++r) sum[r] += alts[c].total_send_bytes()[r];
    }
    best_sum = std::min(best_sum, *std::max_element(sum.begin(), sum.end()));
    const RedistributePlan& mine = per_tensor[0][c];
    if (mine.steps().size() != coalesced.steps().size()) continue;
    bool same = true;
    for (size_t k = 0; k < mine.steps().size(); ++k) same &= mine.steps()[k].after == coalesced.steps()[k].after;
    if (!same) continue;
    ++matched;
    for (size_t k = 0; k < coalesced.steps().size(); ++k) {
      for (int64_t r = 0; r < mesh.size(); ++r) {
        int64_t send = 0, recv = 0;
        for (const auto& alts : per_tensor) {
          send += alts[c].steps()[k].send_bytes[r];
          recv += alts[c].steps()[k].recv_bytes[r];
        }
        CHECK(coalesced.steps()[k].send_bytes[r] == send);
        CHECK(coalesced.steps()[k].recv_bytes[r] == recv);
      }
    }
  }
  CHECK(matched == 1);
  // The coalesced choice minimises the summed bytes of the busiest rank.
  CHECK(coalesced.max_send_bytes() == best_sum);
  CHECK(explain_plan(coalesced).starts_with("redistribute 3 tensors float32[5, 6], bfloat16[3], float64[0, 4]:"));
}

TEST_CASE("planner errors name the tensors, meshes and placements and say what is legal", "[redistribute][errors]") {
  const DeviceMesh mesh = testing::make_mesh({2, 2}, {"dp", "tp"});
  const DTensorSpec spec(mesh, {Partial(), Replicate()}, {8, 6}, kFloat32);
  CHECK_THROWS_MATCHES(plan_redistribute(spec, {Partial(ReduceOp::kAvg), Replicate()}), ValueError,
                       MessageContains("mesh dim 0 (dp) would go from Partial(sum) to Partial(avg)") &&
                           MessageContains("float32[8, 6] (P(sum), R)") &&
                           MessageContains("legal: reduce it first (Partial(sum) -> Replicate)"));
  CHECK_THROWS_MATCHES(plan_redistribute(spec, {Replicate()}), ValueError,
                       MessageContains("redistribute float32[8, 6] (P(sum), R) on DeviceMesh") &&
                           MessageContains("to (R)") && MessageContains("one placement per mesh dim"));
  CHECK_THROWS_MATCHES(plan_redistribute(spec, {Shard(2), Replicate()}), IndexError,
                       MessageContains("redistribute") && MessageContains("Shard(dim=2) on mesh dim 0 (dp)"));
  // Negative target dims are wrapped.
  CHECK(plan_redistribute(spec, {Shard(-1), Replicate()}).target_placements() == Placements{Shard(1), Replicate()});

  const DeviceMesh other = testing::make_mesh({4});
  const std::vector<DTensorSpec> two_meshes = {spec, DTensorSpec(other, {Partial()}, {3}, kFloat32)};
  CHECK_THROWS_MATCHES(plan_redistribute_coalesced(two_meshes, {Replicate(), Replicate()}), ValueError,
                       MessageContains("tensor #1 (float32[3]) is on DeviceMesh('cpu', [0, 1, 2, 3])") &&
                           MessageContains("tensor #0 (float32[8, 6]) is on DeviceMesh('cpu', [[0, 1], [2, 3]]") &&
                           MessageContains("share one mesh"));
  const std::vector<DTensorSpec> two_moves = {spec, DTensorSpec(mesh, {Shard(0), Replicate()}, {4}, kFloat32)};
  CHECK_THROWS_MATCHES(plan_redistribute_coalesced(two_moves, {Replicate(), Replicate()}), ValueError,
                       MessageContains("tensor #1 (float32[4]) moves (S(0), R) -> (R, R)") &&
                           MessageContains("tensor #0 (float32[8, 6]) moves (P(sum), R) -> (R, R)"));
  CHECK_THROWS_MATCHES(plan_redistribute_coalesced({}, {Replicate()}), ValueError, MessageContains("no tensors"));
}

TEST_CASE("can_redistribute says exactly when plan_redistribute has a plan", "[redistribute][errors]") {
  const DeviceMesh mesh = testing::make_mesh({2, 2}, {"dp", "tp"});
  const std::vector<Placement> each = {Replicate(),
                                       Shard(0),
                                       Shard(1),
                                       Shard(2),
                                       Shard(-1),
                                       Partial(),
                                       Partial(ReduceOp::kAvg),
                                       Partial(ReduceOp::kMax)};
  int legal = 0, illegal = 0;
  for (DType dtype : {kFloat32, kInt32}) {
    for (const Placement& a : each) {
      for (const Placement& b : each) {
        if (!DTensorSpec::is_valid(mesh, {a, b}, {8, 6}, dtype)) continue;
        const DTensorSpec spec(mesh, {a, b}, {8, 6}, dtype);
        for (const Placements& target :
             std::vector<Placements>{{Replicate()}, {Replicate(), Replicate(), Replicate()}}) {
          CHECK_FALSE(can_redistribute(spec, target));
          CHECK_THROWS_AS(plan_redistribute(spec, target), Error);
        }
        for (const Placement& c : each) {
          for (const Placement& d : each) {
            INFO(spec.to_string() << " -> " << placements_str({c, d}));
            bool planned = true;
            try {
              plan_redistribute(spec, {c, d});
            } catch (const ValueError&) {
              planned = false;
            } catch (const IndexError&) {
              planned = false;
            } catch (const TypeError&) {
              planned = false;  // Partial(avg) of int32
            }
            CHECK(can_redistribute(spec, {c, d}) == planned);
            (planned ? legal : illegal) += 1;
          }
        }
      }
    }
  }
  // The sweep holds both kinds: Shard(2) of a 2-d tensor, P(sum) -> P(max), mixed P(max) and P(sum).
  CHECK(legal > 0);
  CHECK(illegal > 0);
}

TEST_CASE("explain lists steps, collectives, groups and bytes per rank", "[redistribute][explain]") {
  const DTensorSpec spec(testing::make_mesh({2, 2}, {"dp", "tp"}), {Shard(0), Replicate()}, {8, 6}, kFloat32);
  const std::string text = explain_plan(plan_redistribute(spec, {Replicate(), Shard(1)}));
  CHECK(text ==
        "redistribute float32[8, 6]: (S(0), R) -> (R, S(1)) on DeviceMesh('cpu', [[0, 1], [2, 3]], "
        "mesh_dim_names=('dp', 'tp'))\n"
        "2 steps, 1 collective:\n"
        "  step 1: mesh dim 1 (tp): R -> S(1), chunk (local: each rank keeps its chunk)\n"
        "  step 2: mesh dim 0 (dp): S(0) -> R, all_gather over groups [[0, 2], [1, 3]]\n"
        "bytes per rank (chunks padded to ceil(size/n), so every rank of a group sends equal buffers):\n"
        "rank | coord  | step 2 send/recv | total send | total recv\n"
        "0    | (0, 0) | 48/48            | 48         | 48\n"
        "1    | (0, 1) | 48/48            | 48         | 48\n"
        "2    | (1, 0) | 48/48            | 48         | 48\n"
        "3    | (1, 1) | 48/48            | 48         | 48\n");
  CHECK(explain_plan(plan_redistribute(spec, spec.placements())).ends_with("no steps: the placements already match\n"));
  CHECK(explain_plan(plan_redistribute(spec.with_placements({Replicate(), Replicate()}), {Partial(), Shard(0)}))
            .ends_with("partition (local: coordinate 0 keeps the value, the others hold zeros)\nno communication\n"));
  CHECK_THAT(explain_plan(plan_redistribute(spec.with_placements({Partial(ReduceOp::kAvg), Replicate()}),
                                            {Shard(0), Replicate()})),
             Catch::Matchers::Contains("reduce_scatter(avg) over groups [[0, 2], [1, 3]]"));
}

TEST_CASE("explain with a cost model prints each collective's bytes and predicted time", "[redistribute][explain]") {
  CostModel model("test machine", "gloo");
  model.set(CollectiveKind::kAllGather, 2, {100e-6, 1e9});
  const DTensorSpec spec(testing::make_mesh({2, 2}, {"dp", "tp"}), {Shard(0), Replicate()}, {8, 6}, kFloat32);
  const RedistributePlan p = plan_redistribute(spec, {Replicate(), Shard(1)});
  // Step 2 gathers float32[8, 3] on each rank, 96 B: 100 us + 96 B / 1 GB/s. The steps and
  // the bytes table are those of explain() without a model.
  const std::string text = explain_plan(p, &model);
  CHECK_THAT(text, Catch::Matchers::Contains(
                       "  step 1: mesh dim 1 (tp): R -> S(1), chunk (local: each rank keeps its chunk)\n"
                       "  step 2: mesh dim 0 (dp): S(0) -> R, all_gather over groups [[0, 2], [1, 3]]: 96 B per rank "
                       "~100.1 us\n"
                       "predicted time: ~100.1 us (cost model: test machine, gloo)\n"
                       "bytes per rank"));
  CHECK(text.ends_with(explain_plan(p).substr(explain_plan(p).find("bytes per rank"))));
  // A group of 4 scales the fit at 2: alpha x 3, 1/beta x 1.5; 768 B -> 300 us + 1.152 us.
  CHECK_THAT(explain_plan(plan({4}, {Shard(0)}, {Replicate()}), &model),
             Catch::Matchers::Contains("all_gather over groups [[0, 1, 2, 3]]: 768 B per rank ~301.2 us"));
  // A kind with no fit says so, and the total leaves it out. all_to_all's buffer: 4 blocks of
  // float32[2, 2, 4] (dim 1 padded from 6 to 8), 256 B.
  const std::string no_fit = explain_plan(plan({4}, {Shard(0)}, {Shard(1)}), &model);
  CHECK_THAT(no_fit, Catch::Matchers::Contains(": 256 B per rank, no all_to_all fit in the cost model\n"));
  CHECK_THAT(no_fit, Catch::Matchers::Contains("predicted time: ~0.0 us, leaving out 1 step(s) with no fit"));
  // explain_alternatives shows the same per plan.
  CHECK_THAT(explain_alternatives(plan_alternatives(spec, {Replicate(), Shard(1)}), &model),
             Catch::Matchers::Contains("96 B per rank ~100.1 us\n  predicted time: ~100.1 us"));
}

}  // namespace
}  // namespace dtr
