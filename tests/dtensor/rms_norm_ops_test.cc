// rms_norm on DTensors: gradcheck on one rank, every placement combination on 1-D and 2x2
// meshes against the one-rank result, the rule (rows stay sharded with no communication,
// the weight gradient Partial under data parallelism, a sharded normalised dim gathered)
// against a float64 loop, and values and gradients equal to the composed elementwise path
// (x * rsqrt(mean(x^2) + eps) * weight) that nn::RMSNorm used before the fused op.
#include "dtensor/ops/rms_norm.h"

#include <cmath>

#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/reduce.h"
#include "tests/dtensor/op_test_util.h"

namespace dtr {
namespace {

using testing::global_tensor;
using testing::OpCase;

std::vector<OpCase> cases() {
  const Tensor x = global_tensor({5, 3}, 1), x3 = global_tensor({2, 5, 4}, 2);
  const Tensor w3 = global_tensor({3}, 3), w54 = global_tensor({5, 4}, 5);
  return {
      {"rms_norm [5,3] over [3], weight", {{x}, {w3}}, [](const auto& a) { return rms_norm(a[0], {3}, a[1], 1e-5); }},
      {"rms_norm [2,5,4] over [4], no weight",
       {{x3}},
       [](const auto& a) { return rms_norm(a[0], {4}, std::nullopt, 1e-5); }},
      {"rms_norm [2,5,4] over [5,4], weight",
       {{x3}, {w54}},
       [](const auto& a) {
         return rms_norm(a[0], {5, 4}, a[1], 1e-5);
       }},
  };
}

TEST_CASE("rms_norm: gradcheck on one rank", "[dtensor][ops]") {
  for (const OpCase& c : cases()) testing::gradcheck(c);
}

TEST_CASE("rms_norm: every placement combination on real ranks", "[dtensor][ops]") {
  testing::for_each_test_mesh([](const DeviceMesh& mesh) {
    for (const OpCase& c : cases()) testing::check_distributed(c, mesh);
  });
}

TEST_CASE("rms_norm rules: rows stay sharded, the weight gradient is Partial(sum)", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    const Tensor x = global_tensor({5, 4}, 7), w = global_tensor({4}, 8), g = global_tensor({5, 4}, 10);
    // Reference in float64: y = x / sqrt(mean(x^2) + eps) * w per row; grad_w = sum over rows
    // of g * xhat.
    const double eps = 1e-5;
    const std::vector<double> xv = testing::to_f64(x), wv = testing::to_f64(w), gv = testing::to_f64(g);
    std::vector<double> y(20), grad_w(4, 0.0);
    for (int i = 0; i < 5; ++i) {
      double squares = 0;
      for (int j = 0; j < 4; ++j) squares += xv[i * 4 + j] * xv[i * 4 + j] / 4;
      for (int j = 0; j < 4; ++j) {
        const double xhat = xv[i * 4 + j] / std::sqrt(squares + eps);
        y[i * 4 + j] = xhat * wv[j];
        grad_w[j] += gv[i * 4 + j] * xhat;
      }
    }
    DTensor dx = distribute_tensor(x, mesh, {Shard(0)});
    DTensor dw = distribute_tensor(w, mesh, {Replicate()});
    DTensor dg = distribute_tensor(g, mesh, {Shard(0)});
    dx.requires_grad_();
    dw.requires_grad_();
    dw.set_grad_placements({Partial()});
    collective_counter().reset();
    DTensor out = rms_norm(dx, {4}, dw, eps);
    CHECK(issued_collectives() == 0);
    CHECK(out.placements() == Placements{Shard(0)});
    testing::check_close(out.full_tensor(), x.shape(), y, "rms_norm of S(0) rows");
    collective_counter().reset();
    out.backward(dg);
    CHECK(issued_collectives() == 0);  // grad_x stays S(0), grad_weight stays P(sum)
    CHECK(dx.grad().placements() == Placements{Shard(0)});
    CHECK(dw.grad().placements() == Placements{Partial()});
    testing::check_close(dw.grad().full_tensor(), w.shape(), grad_w, "grad_weight");
    // The normalised dim sharded: gathered first, the value unchanged.
    DTensor cols = distribute_tensor(x, mesh, {Shard(1)});
    collective_counter().reset();
    reset_promised_collectives();
    DTensor out_cols = rms_norm(cols, {4}, dw.detach(), eps);
    CHECK(issued_collectives() == promised_collectives());
    CHECK(issued_collectives() >= 1);
    testing::check_close(out_cols.full_tensor(), x.shape(), y, "rms_norm of S(1) columns");
  });
}

TEST_CASE("rms_norm equals the composed elementwise path, values and gradients", "[dtensor][ops]") {
  testing::run_ranks(2, [](int, int) {
    DeviceMesh mesh = init_device_mesh(kCPU, {2});
    for (DType dtype : {kFloat64, kFloat32}) {
      const Tensor x = global_tensor({6, 3, 8}, 11).to(dtype), w = global_tensor({3, 8}, 12).to(dtype);
      const Tensor g = global_tensor({6, 3, 8}, 13).to(dtype);
      auto run = [&](bool fused) {
        DTensor dx = distribute_tensor(x, mesh, {Shard(0)}), dw = distribute_tensor(w, mesh, {Replicate()});
        dx.requires_grad_();
        dw.requires_grad_();
        // eps unset: the machine epsilon of the dtype, as nn::RMSNorm's default.
        const double eps = dtype == kFloat64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
        DTensor y = fused ? rms_norm(dx, {3, 8}, dw)
                          : mul(mul(dx, rsqrt(add(mean(mul(dx, dx), {1, 2}, KeepDim::kYes), eps))), dw);
        y.backward(distribute_tensor(g, mesh, {Shard(0)}));
        return std::vector<Tensor>{y.full_tensor(), dx.grad().full_tensor(), dw.grad().full_tensor()};
      };
      const std::vector<Tensor> fused = run(true), composed = run(false);
      const testing::Tolerance tol =
          dtype == kFloat64 ? testing::Tolerance{1e-12, 1e-12} : testing::Tolerance{1e-5, 1e-5};
      const char* names[] = {"y", "grad_x", "grad_weight"};
      for (int i = 0; i < 3; ++i) {
        testing::check_close(fused[i], composed[i], tol,
                             fmt::format("{} fused vs composed {}", dtype_name(dtype), names[i]));
      }
    }
  });
}

TEST_CASE("rms_norm: errors name the input, the weight and what is legal", "[dtensor][ops]") {
  const DeviceMesh mesh = single_rank_mesh();
  auto dt = [&](const Shape& shape, DType dtype = kFloat64) {
    return DTensor(Tensor::empty(shape, dtype), DTensorSpec(mesh, {Replicate()}, shape, dtype));
  };
  CHECK_THROWS_WITH(rms_norm(dt({5, 3}), {4}),
                    Catch::Contains("rms_norm: input float64[5, 3] (R) does not end in normalized_shape [4]"));
  CHECK_THROWS_WITH(rms_norm(dt({5, 3}), {3}, dt({4})),
                    Catch::Contains("rms_norm: weight float64[4] (R) for input float64[5, 3] (R)"));
  CHECK_THROWS_AS(rms_norm(dt({5, 3}), {3}, dt({3}, kFloat32)), ValueError);
  CHECK_THROWS_AS(rms_norm(dt({5, 3}, kInt64), {3}), TypeError);
  CHECK_THROWS_WITH(rms_norm(dt({5, 3}), {3}, std::nullopt, -1.0), Catch::Contains("rms_norm: eps -1"));
}

}  // namespace
}  // namespace dtr
