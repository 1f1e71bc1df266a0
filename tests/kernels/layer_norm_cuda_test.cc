// The CUDA layer_norm kernels (kernels/cuda/layer_norm.h) against the CPU kernels on the
// same random inputs: forward (y, mean, rstd) and backward (grad_x, grad_weight, grad_bias)
// in every floating dtype, with and without weight and bias, for rows of 1, 7, 256, 1023 and
// 4097 elements and 1 to 4097 rows, a transposed (copied) input, normalizing over two dims;
// the affine gradients bitwise equal across two runs (deterministic column sums). Tagged
// gpu (Bazel) and [gpu] (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include "kernels/layer_norm.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::random_tensor;
using testing::to_f64;

const Device kGpu(kCUDA, 0);

std::optional<Tensor> on_gpu(const std::optional<Tensor>& t) {
  return t ? std::optional<Tensor>(t->to(kGpu)) : std::nullopt;
}

void check_layer_norm(const Tensor& x, const Shape& normalized, const std::optional<Tensor>& w,
                      const std::optional<Tensor>& b, const std::string& what) {
  const Tensor grad_y = random_tensor(x.shape(), x.dtype(), 99, -1, 1);
  const LayerNormOutput cpu = layer_norm(x, normalized, w, b);
  const LayerNormOutput gpu = layer_norm(x.to(kGpu), normalized, on_gpu(w), on_gpu(b));
  check_close(gpu.y, cpu.y, what + " y");
  check_close(gpu.mean, cpu.mean, what + " mean");
  check_close(gpu.rstd, cpu.rstd, what + " rstd");
  const LayerNormGrads cg = layer_norm_backward(grad_y, x, cpu.mean, cpu.rstd, w);
  const LayerNormGrads gg = layer_norm_backward(grad_y.to(kGpu), x.to(kGpu), gpu.mean, gpu.rstd, on_gpu(w));
  // Sums over every row: the tolerance grows with their number.
  const double rows = static_cast<double>(cpu.mean.numel());
  const testing::Tolerance sums{testing::tolerance_for(x.dtype()).atol * std::sqrt(rows),
                                testing::tolerance_for(x.dtype()).rtol * std::sqrt(rows)};
  check_close(gg.grad_x, cg.grad_x, what + " grad_x");
  check_close(gg.grad_weight, cg.grad_weight, sums, what + " grad_weight");
  check_close(gg.grad_bias, cg.grad_bias, sums, what + " grad_bias");
  const LayerNormGrads again = layer_norm_backward(grad_y.to(kGpu), x.to(kGpu), gpu.mean, gpu.rstd, on_gpu(w));
  CHECK(to_f64(again.grad_weight) == to_f64(gg.grad_weight));
  CHECK(to_f64(again.grad_bias) == to_f64(gg.grad_bias));
}

TEST_CASE("CUDA layer_norm forward and backward match the CPU", "[gpu]") {
  uint64_t seed = 1;
  for (DType d : testing::kFloatDTypes) {
    for (auto [rows, n] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 7}, {4097, 256}, {3, 1023}, {33, 4097}}) {
      const Tensor x = random_tensor({rows, n}, d, seed++, -3, 5);
      const Tensor w = random_tensor({n}, d, seed++, 0.5, 1.5), b = random_tensor({n}, d, seed++, -1, 1);
      const std::string what = fmt::format("{} [{}, {}]", dtype_name(d), rows, n);
      check_layer_norm(x, {n}, w, b, what + " affine");
      check_layer_norm(x, {n}, std::nullopt, std::nullopt, what + " plain");
    }
  }
  const Tensor x = random_tensor({64, 48}, kFloat32, 7, -2, 2);
  check_layer_norm(x.t(), {64}, std::nullopt, std::nullopt, "transposed input");
  const Tensor x3 = random_tensor({5, 6, 8}, kFloat32, 8, -2, 2);
  check_layer_norm(x3, {6, 8}, random_tensor({6, 8}, kFloat32, 9, 0.5, 1.5), std::nullopt, "two normalized dims");
}

}  // namespace
}  // namespace dtr
