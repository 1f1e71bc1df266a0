// View and shape ops on DTensors (view, reshape, flatten, permute, squeeze, narrow, cat,
// split, chunk): gradcheck on one rank, every placement combination on 1-D and 2x2 meshes
// against the one-rank result (uneven and empty shards included), values against index
// loops written here, and which placements stay sharded without communication.
#include "dtensor/ops/view_ops.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/shape_ops.h"
#include "kernels/elementwise.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::on_one_rank;
using testing::OpCase;

std::vector<OpCase> cases() {
  const Tensor a = global_tensor({5, 3}, 1), m = global_tensor({4, 6}, 2), t = global_tensor({6, 2}, 3);
  const Tensor c = global_tensor({2, 5, 4}, 4), u = global_tensor({5, 1, 3}, 5);
  const Tensor rows = global_tensor({2, 3}, 6), none = global_tensor({0, 3}, 7);
  const Tensor col = global_tensor({5, 1}, 8), cols = global_tensor({5, 2}, 9);
  return {
      {"reshape merge [4,6] -> [24]", {{m}}, [](const auto& x) { return reshape(x[0], {24}); }},
      {"reshape merge [5,3] -> [15]", {{a}}, [](const auto& x) { return reshape(x[0], {15}); }},
      {"reshape split [6,2] -> [2,3,2]",
       {{t}},
       [](const auto& x) {
         return reshape(x[0], {2, 3, 2});
       }},
      {"reshape [6,2] -> [3,4]",
       {{t}},
       [](const auto& x) {
         return reshape(x[0], {3, 4});
       }},
      {"reshape [2,5,4] -> [-1,4]",
       {{c}},
       [](const auto& x) {
         return reshape(x[0], {-1, 4});
       }},
      {"view [4,6] -> [4,2,3]",
       {{m}},
       [](const auto& x) {
         return view(x[0], {4, 2, 3});
       }},
      {"flatten [2,5,4] from 1", {{c}}, [](const auto& x) { return flatten(x[0], 1); }},
      {"permute [2,5,4] (2,0,1)",
       {{c}},
       [](const auto& x) {
         return permute(x[0], {2, 0, 1});
       }},
      {"squeeze [5,1,3] dim 1", {{u}}, [](const auto& x) { return squeeze(x[0], 1); }},
      {"squeeze all", {{u}}, [](const auto& x) { return squeeze(x[0]); }},
      {"narrow dim 0", {{a}}, [](const auto& x) { return narrow(x[0], 0, 1, 3); }},
      {"narrow dim 1", {{c}}, [](const auto& x) { return narrow(x[0], 1, 2, 3); }},
      {"cat dim 0 with an empty piece",
       {{a}, {none}, {rows}},
       [](const auto& x) {
         return cat({x[0], x[1], x[2]}, 0);
       }},
      {"cat dim 1",
       {{col}, {a}, {cols}},
       [](const auto& x) {
         return cat({x[0], x[1], x[2]}, -1);
       }},
      {"split size 2 (one piece unused)",
       {{a}},
       [](const auto& x) {
         const std::vector<DTensor> p = split(x[0], 2, 0);
         return cat({p[2], mul(p[0], 3.0)}, 0);
       }},
      {"split sizes {1, 2} dim 1",
       {{a}},
       [](const auto& x) {
         const std::vector<DTensor> p = split(x[0], std::vector<int64_t>{1, 2}, 1);
         return mul(p[1], p[0]);
       }},
      {"chunk 2 of [5,3]",
       {{a}},
       [](const auto& x) {
         const std::vector<DTensor> p = chunk(x[0], 2, 0);
         return sub(narrow(p[0], 0, 0, 2), p[1]);
       }},
      {"chunk 3 of [2,5,4] dim 2",
       {{c}},
       [](const auto& x) {
         const std::vector<DTensor> p = chunk(x[0], 3, 2);
         return add(p[0], mul(p[1], 2.0));
       }},
  };
}

TEST_CASE("view and shape ops: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases()) testing::gradcheck(c);
}

TEST_CASE("view and shape ops: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("view and shape ops: values against index loops", "[dtensor][ops]") {
  const Tensor x = global_tensor({2, 5, 4}, 10);
  const std::vector<double> v = testing::to_f64(x);
  auto at = [&](int64_t i, int64_t j, int64_t k) { return v[(i * 5 + j) * 4 + k]; };
  const DTensor d = on_one_rank(x);
  std::vector<double> permuted, narrowed, joined;
  for (int64_t k = 0; k < 4; ++k) {
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < 5; ++j) permuted.push_back(at(i, j, k));
    }
  }
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 1; j < 4; ++j) {
      for (int64_t k = 0; k < 4; ++k) narrowed.push_back(at(i, j, k));
    }
  }
  for (int64_t i = 0; i < 2; ++i) {  // cat(x, x[:, :, 1:3], dim 2)
    for (int64_t j = 0; j < 5; ++j) {
      for (int64_t k = 0; k < 4; ++k) joined.push_back(at(i, j, k));
      for (int64_t k = 1; k < 3; ++k) joined.push_back(at(i, j, k));
    }
  }
  testing::check_equal(permute(d, {2, 0, 1}).to_local(), Shape{4, 2, 5}, permuted, "permute");
  testing::check_equal(narrow(d, 1, 1, 3).to_local(), Shape{2, 3, 4}, narrowed, "narrow");
  testing::check_equal(cat({d, narrow(d, 2, 1, 2)}, 2).to_local(), Shape{2, 5, 6}, joined, "cat");
  testing::check_equal(reshape(d, {10, 4}).to_local(), Shape{10, 4}, v, "reshape");
  const DTensor y = reshape(d, {4, -1, 5});
  CHECK(y.shape() == Shape{4, 2, 5});
  const std::vector<DTensor> pieces = chunk(d, 4, 1);  // sizes 2, 2, 1
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[2].shape() == Shape{2, 1, 4});
  CHECK(split(narrow(d, 1, 0, 0), 3, 1).size() == 1);  // a size-0 dim gives one empty piece
}

TEST_CASE("view and shape ops keep shards that stay whole, without communication", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor m = global_tensor({4, 6}, 11), a = global_tensor({5, 3}, 12);
    const DTensor rows = distribute_tensor(m, mesh, {Shard(0)}), cols = distribute_tensor(m, mesh, {Shard(1)});
    collective_counter().reset();
    const DTensor merged = reshape(rows, {24});        // rows 0:2 are elements 0:12, chunk 0 of 24
    const DTensor split_cols = view(cols, {4, 2, 3});  // columns 0:3 are the first of two groups of 3
    const DTensor cat_rows = cat({rows, rows}, 1);
    const DTensor narrowed = narrow(rows, 1, 2, 3);
    const std::vector<DTensor> pieces = split(rows, 4, 1);
    const DTensor permuted = permute(cols, {1, 0});
    CHECK(collective_counter().snapshot().empty());
    CHECK(merged.placements() == Placements{Shard(0)});
    CHECK(split_cols.placements() == Placements{Shard(1)});
    CHECK(cat_rows.placements() == Placements{Shard(0)});
    CHECK(narrowed.placements() == Placements{Shard(0)});
    CHECK(pieces[1].placements() == Placements{Shard(0)});
    CHECK(permuted.placements() == Placements{Shard(0)});
    testing::check_equal(merged.full_tensor(), m.reshape({24}), "reshape [4, 6] -> [24]");
    testing::check_equal(split_cols.full_tensor(), m.view({4, 2, 3}), "view [4, 6] -> [4, 2, 3]");
    // [5, 3] S(0) -> [15]: rows 0:3 are elements 0:9 but chunk 0 of 15 is 0:8, so the
    // shard is gathered first (never silently wrong).
    const DTensor uneven = distribute_tensor(a, mesh, {Shard(0)});
    collective_counter().reset();
    const DTensor flat = reshape(uneven, {15});
    CHECK(collective_counter().calls(CollectiveKind::kAllGather) == 1);
    testing::check_equal(flat.full_tensor(), a.reshape({15}), "reshape [5, 3] -> [15]");
    // Narrowing or cutting the sharded dim gathers it first.
    collective_counter().reset();
    testing::check_equal(narrow(rows, 0, 1, 2).full_tensor(), m.narrow(0, 1, 2), "narrow dim 0");
    CHECK(collective_counter().calls(CollectiveKind::kAllGather) >= 1);
  });
}

TEST_CASE("reshape keeps nested shards on a 2x2 mesh when every rank's chunk stays whole", "[dtensor][ops]") {
  testing::run_ranks(4, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2, 2});
    const Tensor m = global_tensor({8, 3}, 13);
    const DTensor nested = distribute_tensor(m, mesh, {Shard(0), Shard(0)});
    collective_counter().reset();
    const DTensor flat = reshape(nested, {24});
    CHECK(collective_counter().snapshot().empty());
    CHECK(flat.placements() == Placements{Shard(0), Shard(0)});
    testing::check_equal(flat.full_tensor(), m.reshape({24}), "nested reshape");
  });
}

TEST_CASE("view and shape ops: errors name the op and the inputs", "[dtensor][ops]") {
  const DTensor a = on_one_rank(global_tensor({5, 3}, 1)), b = on_one_rank(global_tensor({4, 2}, 2));
  CHECK_THROWS_AS(reshape(a, {4, 4}), ValueError);
  CHECK_THROWS_AS(reshape(a, {-1, -1}), ValueError);
  CHECK_THROWS_AS(view(transpose(a, 0, 1), {15}), ValueError);  // the local view needs a copy
  CHECK_THROWS_AS(permute(a, {0, 0}), ValueError);
  CHECK_THROWS_WITH(permute(a, {0, 0}), Catch::Contains("permute") && Catch::Contains("float64[5, 3] (R)"));
  CHECK_THROWS_AS(cat({a, b}, 0), ValueError);
  CHECK_THROWS_WITH(cat({a, b}, 0), Catch::Contains("float64[5, 3] (R)") && Catch::Contains("float64[4, 2] (R)"));
  CHECK_THROWS_AS(cat({a, on_one_rank(global_tensor({5, 3}, 1).to(kFloat32))}, 0), TypeError);
  CHECK_THROWS_AS(cat({}, 0), ValueError);
  CHECK_THROWS_AS(split(a, std::vector<int64_t>{2, 2}, 0), ValueError);
  CHECK_THROWS_AS(split(a, 0, 0), ValueError);
  CHECK_THROWS_AS(chunk(a, 0, 1), ValueError);
  CHECK_THROWS_AS(narrow(a, 0, 3, 3), IndexError);
  CHECK_THROWS_AS(narrow(a, 2, 0, 1), IndexError);
  CHECK_THROWS_AS(flatten(a, 1, 0), ValueError);
}

}  // namespace
}  // namespace dtr
