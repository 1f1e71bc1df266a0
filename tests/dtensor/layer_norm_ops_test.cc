// layer_norm on DTensors: gradcheck on one rank, every placement combination on 1-D and
// 2x2 meshes against the one-rank result, and the rule (rows stay sharded, parameter
// gradients Partial under data parallelism) against a float64 loop.
#include "dtensor/ops/layer_norm.h"

#include <cmath>

#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::OpCase;

std::vector<OpCase> cases() {
  const Tensor x = global_tensor({5, 3}, 1), x3 = global_tensor({2, 5, 4}, 2);
  const Tensor w3 = global_tensor({3}, 3), b3 = global_tensor({3}, 4), w4 = global_tensor({4}, 5);
  return {
      {"layer_norm [5,3] over [3], weight and bias",
       {{x}, {w3}, {b3}},
       [](const auto& a) { return layer_norm(a[0], {3}, a[1], a[2]); }},
      {"layer_norm [2,5,4] over [4], weight only",
       {{x3}, {w4}},
       [](const auto& a) { return layer_norm(a[0], {4}, a[1]); }},
      {"layer_norm [2,5,4] over [5,4], no affine",
       {{x3}},
       [](const auto& a) {
         return layer_norm(a[0], {5, 4});
       }},
  };
}

TEST_CASE("layer_norm: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases()) testing::gradcheck(c);
}

TEST_CASE("layer_norm: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("layer_norm rules: rows stay sharded, parameter gradients are Partial(sum)", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor x = global_tensor({5, 4}, 7), w = global_tensor({4}, 8), b = global_tensor({4}, 9);
    const Tensor g = global_tensor({5, 4}, 10);
    // Reference in float64: y = (x - mean) / sqrt(var + eps) * w + b per row; grad_b = sum of g
    // over rows; grad_w = sum over rows of g * xhat.
    const double eps = 1e-5;
    const std::vector<double> xv = testing::to_f64(x), wv = testing::to_f64(w), bv = testing::to_f64(b),
                              gv = testing::to_f64(g);
    std::vector<double> y(20), grad_w(4, 0.0), grad_b(4, 0.0);
    for (int i = 0; i < 5; ++i) {
      double mean = 0, var = 0;
      for (int j = 0; j < 4; ++j) mean += xv[i * 4 + j] / 4;
      for (int j = 0; j < 4; ++j) var += (xv[i * 4 + j] - mean) * (xv[i * 4 + j] - mean) / 4;
      for (int j = 0; j < 4; ++j) {
        const double xhat = (xv[i * 4 + j] - mean) / std::sqrt(var + eps);
        y[i * 4 + j] = xhat * wv[j] + bv[j];
        grad_w[j] += gv[i * 4 + j] * xhat;
        grad_b[j] += gv[i * 4 + j];
      }
    }
    DTensor dx = distribute_tensor(x, mesh, {Shard(0)});
    DTensor dw = distribute_tensor(w, mesh, {Replicate()}), db = distribute_tensor(b, mesh, {Replicate()});
    DTensor dg = distribute_tensor(g, mesh, {Shard(0)});
    dw.requires_grad_();
    db.requires_grad_();
    dw.set_grad_placements({Partial()});
    db.set_grad_placements({Partial()});
    collective_counter().reset();
    DTensor out = layer_norm(dx, {4}, dw, db, eps);
    CHECK(issued_collectives() == 0);
    CHECK(out.placements() == Placements{Shard(0)});
    testing::check_close(out.full_tensor(), x.shape(), y, "layer_norm of S(0) rows");
    out.backward(dg);
    CHECK(dw.grad().placements() == Placements{Partial()});
    CHECK(db.grad().placements() == Placements{Partial()});
    testing::check_close(dw.grad().full_tensor(), w.shape(), grad_w, "grad_weight");
    testing::check_equal(db.grad().full_tensor(), b.shape(), grad_b, "grad_bias (integer sums, exact)");
    // The normalised dim sharded: gathered first, the value unchanged.
    DTensor cols = distribute_tensor(x, mesh, {Shard(1)});
    collective_counter().reset();
    reset_promised_collectives();
    DTensor out_cols = layer_norm(cols, {4}, dw.detach(), db.detach(), eps);
    CHECK(issued_collectives() == promised_collectives());
    testing::check_close(out_cols.full_tensor(), x.shape(), y, "layer_norm of S(1) columns");
  });
}

TEST_CASE("layer_norm: errors name the input, the parameters and what is legal", "[dtensor][ops]") {
  const DeviceMesh mesh = single_rank_mesh();
  auto dt = [&](const Shape& shape, DType dtype = kFloat64) {
    return DTensor(Tensor::empty(shape, dtype), DTensorSpec(mesh, {Replicate()}, shape, dtype));
  };
  CHECK_THROWS_WITH(layer_norm(dt({5, 3}), {4}),
                    Catch::Contains("layer_norm: input float64[5, 3] (R) does not end in normalized_shape [4]"));
  CHECK_THROWS_WITH(layer_norm(dt({5, 3}), {3}, dt({4})),
                    Catch::Contains("layer_norm: weight float64[4] (R) for input float64[5, 3] (R)"));
  CHECK_THROWS_AS(layer_norm(dt({5, 3}), {3}, dt({3}), dt({3}, kFloat32)), ValueError);
  CHECK_THROWS_AS(layer_norm(dt({5, 3}, kInt64), {3}), TypeError);
}

}  // namespace
}  // namespace dtr
