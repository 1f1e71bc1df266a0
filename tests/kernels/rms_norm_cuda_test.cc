// The CUDA rms_norm kernels (kernels/cuda/rms_norm.h) against the CPU kernels on the same
// random inputs: forward (y, rstd) and backward (grad_x, grad_weight) in every floating
// dtype, with and without weight, for rows of 1, 7, 1023 and 4097 elements, transformer
// shapes (4096 rows of 768, 2048 rows of 4096), a transposed (copied) input, normalizing
// over two dims, the default eps; the weight gradient bitwise equal across two runs
// (deterministic column sums); an exact case. Tagged gpu (Bazel) and [gpu] (Catch2):
// CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "kernels/rms_norm.h"
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

void check_rms_norm(const Tensor& x, const Shape& normalized, const std::optional<Tensor>& w, const std::string& what,
                    std::optional<double> eps = 1e-6) {
  const Tensor grad_y = random_tensor(x.shape(), x.dtype(), 99, -1, 1);
  const RMSNormOutput cpu = rms_norm(x, normalized, w, eps);
  const RMSNormOutput gpu = rms_norm(x.to(kGpu), normalized, on_gpu(w), eps);
  CHECK(gpu.y.device() == kGpu);
  CHECK(gpu.rstd.dtype() == cpu.rstd.dtype());
  check_close(gpu.y, cpu.y, what + " y");
  check_close(gpu.rstd, cpu.rstd, what + " rstd");
  const RMSNormGrads cg = rms_norm_backward(grad_y, x, cpu.rstd, w);
  const RMSNormGrads gg = rms_norm_backward(grad_y.to(kGpu), x.to(kGpu), gpu.rstd, on_gpu(w));
  // Sums over every row: the tolerance grows with their number.
  const double rows = static_cast<double>(cpu.rstd.numel());
  const testing::Tolerance sums{testing::tolerance_for(x.dtype()).atol * std::sqrt(rows),
                                testing::tolerance_for(x.dtype()).rtol * std::sqrt(rows)};
  check_close(gg.grad_x, cg.grad_x, what + " grad_x");
  check_close(gg.grad_weight, cg.grad_weight, sums, what + " grad_weight");
  const RMSNormGrads again = rms_norm_backward(grad_y.to(kGpu), x.to(kGpu), gpu.rstd, on_gpu(w));
  CHECK(to_f64(again.grad_weight) == to_f64(gg.grad_weight));
  CHECK(to_f64(again.grad_x) == to_f64(gg.grad_x));
}

TEST_CASE("CUDA rms_norm forward and backward match the CPU", "[gpu]") {
  uint64_t seed = 1;
  for (DType d : testing::kFloatDTypes) {
    for (auto [rows, n] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 1}, {7, 7}, {3, 1023}, {33, 4097}, {4097, 64}, {4096, 768}, {2048, 4096}}) {
      const Tensor x = random_tensor({rows, n}, d, seed++, -3, 5);
      const Tensor w = random_tensor({n}, d, seed++, 0.5, 1.5);
      const std::string what = fmt::format("{} [{}, {}]", dtype_name(d), rows, n);
      check_rms_norm(x, {n}, w, what + " weighted");
      check_rms_norm(x, {n}, std::nullopt, what + " plain");
    }
    const Tensor small = random_tensor({16, 96}, d, seed++, -0.05, 0.05);
    check_rms_norm(small, {96}, std::nullopt, fmt::format("{} default eps", dtype_name(d)), std::nullopt);
  }
  const Tensor x = random_tensor({64, 48}, kFloat32, 7, -2, 2);
  check_rms_norm(x.t(), {64}, std::nullopt, "transposed input");
  check_rms_norm(testing::strided_copy(x), {48}, random_tensor({48}, kFloat32, 8, 0.5, 1.5), "strided input");
  const Tensor x3 = random_tensor({5, 6, 8}, kFloat32, 8, -2, 2);
  check_rms_norm(x3, {6, 8}, random_tensor({6, 8}, kFloat32, 9, 0.5, 1.5), "two normalized dims");
  check_rms_norm(random_tensor({0, 8}, kFloat32, 10), {8}, std::nullopt, "no rows");
}

TEST_CASE("CUDA rms_norm of rows with exactly known mean squares is exact", "[gpu]") {
  // As the CPU test: mean(x^2) = 4 in both rows, rstd = 1/2 with eps 0.
  for (DType d : testing::kFloatDTypes) {
    const Tensor x = Tensor::from_vector(std::vector<double>{2, -2, 2, -2, 0, 0, 0, 4}, {2, 4}).to(d).to(kGpu);
    const Tensor w = Tensor::from_vector(std::vector<double>{2, 2, 0.5, 1}).to(d).to(kGpu);
    const RMSNormOutput out = rms_norm(x, {4}, w, 0.0);
    testing::check_equal(out.y, Shape{2, 4}, {2, -2, 0.5, -1, 0, 0, 0, 2}, "y");
    testing::check_equal(out.rstd, Shape{2}, {0.5, 0.5}, "rstd");
    const RMSNormGrads grads = rms_norm_backward(ones({2, 4}, d, kGpu), x, out.rstd, w);
    testing::check_equal(grads.grad_weight, Shape{4}, {1, -1, 1, 1}, "grad_weight");
    testing::check_equal(grads.grad_x, Shape{2, 4}, {1.0625, 0.9375, 0.3125, 0.4375, 1, 1, 0.25, 0}, "grad_x");
  }
}

}  // namespace
}  // namespace dtr
