// matmul and bmm on CUDA (cuBLASLt, kernels/cuda/matmul.h) against the CPU kernel (Eigen) on
// the same random operands: every floating dtype; shapes of 1 and odd sizes, a transformer
// layer's [2048, 256] x [256, 1024], batches; transposed views taken as they are and other
// strides copied; a batch broadcast with stride 0; K = 0; TF32; and the error for mixed
// devices. Tagged gpu (Bazel) and [gpu] (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <string>

#include "kernels/error.h"
#include "kernels/fill.h"
#include "kernels/matmul.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::random_tensor;
using testing::to_f64;

const Device kGpu(kCUDA, 0);

// Summation orders differ (Eigen's blocks, cuBLASLt's tiles): the tolerance grows with K.
testing::Tolerance tolerance(DType d, int64_t k) {
  const double scale = std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)));
  switch (d) {
    case kFloat64: return {1e-12 * scale, 1e-12 * scale};
    case kFloat32: return {2e-6 * scale, 2e-6 * scale};
    default: return {2e-2, 2e-2};  // one rounding to 8 (bf16) or 11 (f16) bits of a float32 sum
  }
}

void check_matmul(const Tensor& a, const Tensor& b, const Tensor& ga, const Tensor& gb, const std::string& what) {
  const Tensor expected = matmul(a, b);
  const Tensor got = matmul(ga, gb);
  REQUIRE(got.device() == kGpu);
  check_close(got, to_f64(expected), tolerance(a.dtype(), a.size(1)), what);
}

TEST_CASE("CUDA matmul matches the CPU in every floating dtype and shape", "[gpu]") {
  uint64_t seed = 1;
  for (DType d : testing::kFloatDTypes) {
    for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{
             {1, 1, 1}, {7, 13, 5}, {1023, 33, 65}, {128, 4097, 64}, {2048, 256, 1024}}) {
      const Tensor a = random_tensor({m, k}, d, seed++), b = random_tensor({k, n}, d, seed++);
      const std::string what = fmt::format("{} [{}, {}] x [{}, {}]", dtype_name(d), m, k, k, n);
      check_matmul(a, b, a.to(kGpu), b.to(kGpu), what);
      // Transposed views (row stride 1) go in as they are.
      const Tensor base_a = random_tensor({k, m}, d, seed++), base_b = random_tensor({n, k}, d, seed++);
      check_matmul(base_a.t(), b, base_a.to(kGpu).t(), b.to(kGpu), what + " (transposed a)");
      check_matmul(a, base_b.t(), a.to(kGpu), base_b.to(kGpu).t(), what + " (transposed b)");
      check_matmul(base_a.t(), base_b.t(), base_a.to(kGpu).t(), base_b.to(kGpu).t(), what + " (both transposed)");
    }
  }
}

TEST_CASE("CUDA bmm: batches, a broadcast batch, strided views copied, K = 0, TF32", "[gpu]") {
  const Tensor a = random_tensor({6, 33, 17}, kFloat32, 1), b = random_tensor({6, 17, 9}, kFloat32, 2);
  check_close(bmm(a.to(kGpu), b.to(kGpu)), to_f64(bmm(a, b)), tolerance(kFloat32, 17), "bmm");
  // The same right operand for every batch: stride 0, no copy.
  const Tensor shared = random_tensor({1, 17, 9}, kFloat32, 3);
  check_close(bmm(a.to(kGpu), shared.to(kGpu).expand({6, 17, 9})), to_f64(bmm(a, shared.expand({6, 17, 9}))),
              tolerance(kFloat32, 17), "broadcast batch");
  // Every other column: neither stride is 1, so the operand is copied first.
  const Tensor wide = random_tensor({33, 34}, kFloat32, 4), right = random_tensor({17, 5}, kFloat32, 5);
  const Tensor cols = wide.slice(1, 0, 34, 2);
  check_close(matmul(wide.to(kGpu).slice(1, 0, 34, 2), right.to(kGpu)), to_f64(matmul(cols, right)),
              tolerance(kFloat32, 17), "strided columns");
  const Tensor none = matmul(zeros({4, 0}, kFloat32, kGpu), zeros({0, 3}, kFloat32, kGpu));
  testing::check_equal(none, std::vector<double>(12, 0.0), "K = 0");
  // TF32: products of 10-bit mantissas, accumulated in float32.
  const Tensor x = random_tensor({256, 512}, kFloat32, 6), y = random_tensor({512, 128}, kFloat32, 7);
  set_matmul_allow_tf32(true);
  const Tensor tf32 = matmul(x.to(kGpu), y.to(kGpu));
  set_matmul_allow_tf32(false);
  check_close(tf32, to_f64(matmul(x, y)), {2e-2, 2e-2}, "tf32");
}

TEST_CASE("CUDA matmul errors name the operands", "[gpu]") {
  const Tensor a = zeros({2, 3}, kFloat32, kGpu);
  CHECK_THROWS_MATCHES(matmul(a, zeros({3, 2})), ValueError, testing::MessageContains("on different devices"));
  CHECK_THROWS_AS(matmul(zeros({2, 3}, kInt32, kGpu), zeros({3, 2}, kInt32, kGpu)), TypeError);
}

}  // namespace
}  // namespace dtr
