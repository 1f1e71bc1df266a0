// matmul and bmm on CUDA (cuBLASLt, kernels/cuda/matmul.h) against the CPU kernel (Eigen) on
// the same random operands: every floating dtype; shapes of 1 and odd sizes, a transformer
// layer's [2048, 256] x [256, 1024], batches; transposed views taken as they are and other
// strides copied; a batch broadcast with stride 0; K = 0; TF32; and the error for mixed
// devices. matmul_bias's cuBLASLt epilogues (bias, bias + tanh GELU, and the GELU's saved
// input) against the CPU's matmul, add and gelu at a transformer MLP's shapes and odd ones
// (N not a multiple of 8, N = 1), transposed weights, a misaligned bias, a folded batch and
// K = 0. Tagged gpu (Bazel) and [gpu] (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/trace.h"
#include "kernels/elementwise.h"
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
  check_close(got, expected, tolerance(a.dtype(), a.size(1)), what);
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
  check_close(bmm(a.to(kGpu), b.to(kGpu)), bmm(a, b), tolerance(kFloat32, 17), "bmm");
  // The same right operand for every batch: stride 0, no copy.
  const Tensor shared = random_tensor({1, 17, 9}, kFloat32, 3);
  check_close(bmm(a.to(kGpu), shared.to(kGpu).expand({6, 17, 9})), bmm(a, shared.expand({6, 17, 9})),
              tolerance(kFloat32, 17), "broadcast batch");
  // Every other column: neither stride is 1, so the operand is copied first.
  const Tensor wide = random_tensor({33, 34}, kFloat32, 4), right = random_tensor({17, 5}, kFloat32, 5);
  const Tensor cols = wide.slice(1, 0, 34, 2);
  check_close(matmul(wide.to(kGpu).slice(1, 0, 34, 2), right.to(kGpu)), matmul(cols, right), tolerance(kFloat32, 17),
              "strided columns");
  const Tensor none = matmul(zeros({4, 0}, kFloat32, kGpu), zeros({0, 3}, kFloat32, kGpu));
  testing::check_equal(none, Shape{4, 3}, std::vector<double>(12, 0.0), "K = 0");
  // TF32: products of 10-bit mantissas, accumulated in float32.
  const Tensor x = random_tensor({256, 512}, kFloat32, 6), y = random_tensor({512, 128}, kFloat32, 7);
  set_matmul_allow_tf32(true);
  const Tensor tf32 = matmul(x.to(kGpu), y.to(kGpu));
  set_matmul_allow_tf32(false);
  check_close(tf32, matmul(x, y), {2e-2, 2e-2}, "tf32");
}

// The epilogue's tolerance: the product's, and for the GELU cuBLASLt's own float32 tanh
// (possibly the hardware approximation, ~2^-11 relative) on pre-activations of order 1.
testing::Tolerance epilogue_tolerance(DType d, int64_t k, MatmulEpilogue epilogue) {
  const testing::Tolerance t = tolerance(d, k);
  if (epilogue == MatmulEpilogue::kBias || d == kBFloat16 || d == kFloat16) return t;
  return {std::max(t.atol, 1e-3), std::max(t.rtol, 1e-3)};
}

// matmul_bias and matmul_bias_gelu of the GPU operands against the CPU's on the same values.
void check_matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& ga, const Tensor& gb,
                       const Tensor& gbias, const std::string& what) {
  const int64_t k = a.size(-1);
  for (MatmulEpilogue e : {MatmulEpilogue::kBias, MatmulEpilogue::kBiasGeluTanh}) {
    const Tensor got = matmul_bias(ga, gb, gbias, e);
    REQUIRE(got.device() == kGpu);
    check_close(got, matmul_bias(a, b, bias, e), epilogue_tolerance(a.dtype(), k, e),
                what + (e == MatmulEpilogue::kBias ? ", bias" : ", bias + gelu"));
  }
  const MatmulBiasGelu expected = matmul_bias_gelu(a, b, bias);
  const MatmulBiasGelu got = matmul_bias_gelu(ga, gb, gbias);
  REQUIRE(got.pre.shape() == expected.pre.shape());
  CHECK(got.pre.stride(-2) % 8 == 0);  // cuBLASLt's aux rows: a multiple of 8 apart
  check_close(got.out, expected.out, epilogue_tolerance(a.dtype(), k, MatmulEpilogue::kBiasGeluTanh),
              what + ", matmul_bias_gelu out");
  check_close(got.pre, expected.pre, tolerance(a.dtype(), k), what + ", matmul_bias_gelu pre");
}

TEST_CASE("CUDA matmul_bias epilogues match the CPU at transformer and odd shapes", "[gpu]") {
  uint64_t seed = 500;
  for (DType d : testing::kFloatDTypes) {
    // An MLP's up and down projections (dim 256, hidden 1024, 2048 tokens), then odd sizes:
    // N = 1, N not a multiple of 8, K and M off every tile.
    for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{
             {2048, 256, 1024}, {2048, 1024, 256}, {1, 1, 1}, {7, 13, 5}, {33, 17, 9}, {1023, 33, 65}, {64, 64, 1}}) {
      // Weights scaled like a layer's (1/sqrt(K)): pre-activations of order 1, where GELU bends.
      const double scale = 1.0 / std::sqrt(static_cast<double>(k));
      const Tensor a = random_tensor({m, k}, d, seed++), bias = random_tensor({n}, d, seed++);
      const Tensor w = random_tensor({n, k}, d, seed++, -scale, scale);  // linear's weight [out, in]
      const std::string what = fmt::format("{} [{}, {}] x [{}, {}]", dtype_name(d), m, k, k, n);
      // b = w^T (a transposed view, as linear passes it) and b contiguous.
      check_matmul_bias(a, w.t(), bias, a.to(kGpu), w.to(kGpu).t(), bias.to(kGpu), what + " (b = w^T)");
      const Tensor b = w.t().contiguous();
      check_matmul_bias(a, b, bias, a.to(kGpu), b.to(kGpu), bias.to(kGpu), what);
    }
  }
}

TEST_CASE("CUDA matmul_bias takes cuBLASLt's epilogue for aligned float32, bfloat16 and float16", "[gpu]") {
  for (DType d : {kFloat32, kBFloat16, kFloat16}) {
    const Tensor a = random_tensor({512, 256}, d, 701), b = random_tensor({256, 1024}, d, 702, -0.1, 0.1);
    const Tensor ga = a.to(kGpu), gb = b.to(kGpu), gbias = random_tensor({1024}, d, 703).to(kGpu);
    for (int variant = 0; variant < 3; ++variant) {
      INFO(dtype_name(d) << " variant " << variant << " (bias, bias + gelu, matmul_bias_gelu)");
      trace::start(trace::bit(trace::Category::kKernel));
      if (variant < 2) {
        matmul_bias(ga, gb, gbias, variant == 0 ? MatmulEpilogue::kBias : MatmulEpilogue::kBiasGeluTanh);
      } else {
        matmul_bias_gelu(ga, gb, gbias);
      }
      std::vector<std::string> kernels;
      for (const trace::ThreadEvents& t : trace::stop()) {
        for (const trace::Event& e : t.events) kernels.push_back(e.name);
      }
      // One kernel span, the op's own: no matmul, add or gelu of the composed path inside it.
      CHECK(kernels == std::vector<std::string>{variant < 2 ? "matmul_bias" : "matmul_bias_gelu"});
    }
  }
}

TEST_CASE("CUDA matmul_bias: misaligned operands, a folded batch, K = 0, TF32", "[gpu]") {
  for (DType d : testing::kFloatDTypes) {
    const Tensor a = random_tensor({65, 40}, d, 601), b = random_tensor({40, 24}, d, 602, -0.2, 0.2);
    const Tensor wide_bias = random_tensor({25}, d, 603);
    // The bias one element into its storage (2 or 4 bytes aligned): cuBLASLt takes it or the
    // composed path runs; the values are the same either way.
    const Tensor bias = wide_bias.narrow(0, 1, 24);
    check_matmul_bias(a, b, bias, a.to(kGpu), b.to(kGpu), wide_bias.to(kGpu).narrow(0, 1, 24),
                      fmt::format("{} misaligned bias", dtype_name(d)));
    // a one element into its storage, rows 41 apart: odd addresses and leading dimension.
    const Tensor wide = random_tensor({65, 41}, d, 604);
    check_matmul_bias(wide.narrow(1, 1, 40), b, bias.contiguous(), wide.to(kGpu).narrow(1, 1, 40), b.to(kGpu),
                      bias.contiguous().to(kGpu), fmt::format("{} misaligned a", dtype_name(d)));
    // A [2, 5, 40] input folds into 10 rows.
    const Tensor a3 = random_tensor({2, 5, 40}, d, 605);
    const Tensor y3 = matmul_bias(a3.to(kGpu), b.to(kGpu), bias.contiguous().to(kGpu));
    REQUIRE(y3.shape() == Shape{2, 5, 24});
    check_close(y3, matmul_bias(a3, b, bias.contiguous()), tolerance(d, 40), "folded batch");
    // K = 0: the bias alone (and its GELU).
    const Tensor none_a = zeros({4, 0}, d, kGpu), none_b = zeros({0, 24}, d, kGpu);
    const Tensor cpu_bias = bias.contiguous();
    check_close(matmul_bias(none_a, none_b, cpu_bias.to(kGpu)), cpu_bias.unsqueeze(0).expand({4, 24}), {0.0, 0.0},
                "K = 0");
    const MatmulBiasGelu g = matmul_bias_gelu(none_a, none_b, cpu_bias.to(kGpu));
    check_close(g.pre, cpu_bias.unsqueeze(0).expand({4, 24}), {0.0, 0.0}, "K = 0, pre");
    check_close(g.out, gelu(cpu_bias, GeluApproximation::kTanh).unsqueeze(0).expand({4, 24}), tolerance(d, 1),
                "K = 0, gelu");
  }
  const Tensor x = random_tensor({256, 512}, kFloat32, 606), y = random_tensor({512, 128}, kFloat32, 607, -0.05, 0.05);
  const Tensor bias = random_tensor({128}, kFloat32, 608);
  set_matmul_allow_tf32(true);
  const Tensor tf32 = matmul_bias(x.to(kGpu), y.to(kGpu), bias.to(kGpu), MatmulEpilogue::kBiasGeluTanh);
  set_matmul_allow_tf32(false);
  check_close(tf32, matmul_bias(x, y, bias, MatmulEpilogue::kBiasGeluTanh), {2e-2, 2e-2}, "tf32 bias + gelu");
}

TEST_CASE("CUDA matmul errors name the operands", "[gpu]") {
  const Tensor a = zeros({2, 3}, kFloat32, kGpu);
  CHECK_THROWS_MATCHES(matmul(a, zeros({3, 2})), ValueError, testing::MessageContains("on different devices"));
  CHECK_THROWS_AS(matmul(zeros({2, 3}, kInt32, kGpu), zeros({3, 2}, kInt32, kGpu)), TypeError);
  const Tensor b = zeros({3, 4}, kFloat32, kGpu);
  CHECK_THROWS_MATCHES(matmul_bias(a, b, zeros({4})), ValueError,
                       testing::MessageContains("matmul_bias: bias float32[4] is not on the operands' device cuda:0"));
  CHECK_THROWS_AS(matmul_bias(a, b, zeros({4}, kBFloat16, kGpu)), TypeError);
  CHECK_THROWS_AS(matmul_bias_gelu(a, b, zeros({3}, kFloat32, kGpu)), ValueError);
}

}  // namespace
}  // namespace dtr
