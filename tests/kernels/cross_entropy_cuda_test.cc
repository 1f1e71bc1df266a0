// The CUDA cross-entropy kernels (kernels/cuda/cross_entropy.h) against the CPU kernels on
// the same random logits: loss, logsumexp and the gradient, mean and sum, in every floating
// dtype, for 1 to 4097 rows of 1 to 50257 classes, with ignored rows, every row ignored
// (NaN mean), a grad_loss on the device and on the host; label smoothing against the CPU
// and an exact smoothed case; a target out of range is an IndexError. Tagged gpu (Bazel)
// and [gpu] (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cross_entropy.h"
#include "kernels/fill.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::random_tensor;
using testing::to_f64;

const Device kGpu(kCUDA, 0);

TEST_CASE("CUDA cross_entropy and its backward match the CPU", "[gpu]") {
  uint64_t seed = 1;
  for (DType d : testing::kFloatDTypes) {
    for (auto [n, c] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 7}, {4097, 64}, {33, 4096}, {3, 50257}}) {
      const Tensor logits = random_tensor({n, c}, d, seed++, -8, 8);
      Tensor target = random_tensor({n}, kInt64, seed++, 0, static_cast<double>(c));
      if (n > 2) target.data_ptr<int64_t>()[1] = -100;  // an ignored row
      for (LossReduction r : {LossReduction::kMean, LossReduction::kSum}) {
        const std::string what =
            fmt::format("{} [{}, {}] {}", dtype_name(d), n, c, r == LossReduction::kMean ? "mean" : "sum");
        const CrossEntropyOutput cpu = cross_entropy(logits, target, -100, r);
        const CrossEntropyOutput gpu = cross_entropy(logits.to(kGpu), target.to(kGpu), -100, r);
        check_close(gpu.loss, cpu.loss, what + " loss");
        check_close(gpu.logsumexp, cpu.logsumexp, what + " logsumexp");
        const Tensor g = full({}, 0.5, kFloat32);
        const Tensor expected = cross_entropy_backward(g, logits, target, cpu.logsumexp, -100, r);
        check_close(cross_entropy_backward(g.to(kGpu), logits.to(kGpu), target.to(kGpu), gpu.logsumexp, -100, r),
                    expected, what + " grad (grad_loss on the device)");
        check_close(cross_entropy_backward(g, logits.to(kGpu), target.to(kGpu), gpu.logsumexp, -100, r), expected,
                    what + " grad (grad_loss on the host)");
      }
    }
  }
}

TEST_CASE("CUDA cross_entropy with label smoothing matches the CPU", "[gpu]") {
  uint64_t seed = 100;
  for (DType d : testing::kFloatDTypes) {
    for (auto [n, c] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 7}, {4097, 64}, {33, 4097}, {3, 50257}}) {
      const Tensor logits = random_tensor({n, c}, d, seed++, -8, 8);
      Tensor target = random_tensor({n}, kInt64, seed++, 0, static_cast<double>(c));
      if (n > 2) target.data_ptr<int64_t>()[1] = -100;
      for (double e : {0.1, 1.0}) {
        for (LossReduction r : {LossReduction::kMean, LossReduction::kSum}) {
          const std::string what = fmt::format("{} [{}, {}] {} label_smoothing {}", dtype_name(d), n, c,
                                               r == LossReduction::kMean ? "mean" : "sum", e);
          const CrossEntropyOutput cpu = cross_entropy(logits, target, -100, r, e);
          const CrossEntropyOutput gpu = cross_entropy(logits.to(kGpu), target.to(kGpu), -100, r, e);
          check_close(gpu.loss, cpu.loss, what + " loss");
          check_close(gpu.logsumexp, cpu.logsumexp, what + " logsumexp");
          const Tensor g = full({}, 0.5, kFloat32);
          const Tensor expected = cross_entropy_backward(g, logits, target, cpu.logsumexp, -100, r, e);
          check_close(cross_entropy_backward(g.to(kGpu), logits.to(kGpu), target.to(kGpu), gpu.logsumexp, -100, r, e),
                      expected, what + " grad");
        }
      }
      // The loss is a fixed-order sum: two runs agree bit for bit.
      const Tensor lg = logits.to(kGpu), tg = target.to(kGpu);
      CHECK(to_f64(cross_entropy(lg, tg, -100, LossReduction::kMean, 0.1).loss) ==
            to_f64(cross_entropy(lg, tg, -100, LossReduction::kMean, 0.1).loss));
    }
  }
}

TEST_CASE("CUDA cross_entropy with label smoothing and well-separated logits is exact", "[gpu]") {
  // As the CPU test: lse 0, softmax onehot(0); e = 1/2, C = 4, row losses 288 and 672.
  const double lo = -768.0;
  const Tensor target = Tensor::from_vector(std::vector<int64_t>{0, 1, -100}).to(kGpu);
  for (DType d : testing::kFloatDTypes) {
    const Tensor logits =
        Tensor::from_vector(std::vector<double>{0, lo, lo, lo, 0, lo, lo, lo, lo, 0, lo, lo}, {3, 4}).to(d).to(kGpu);
    const CrossEntropyOutput mean = cross_entropy(logits, target, -100, LossReduction::kMean, 0.5);
    testing::check_equal(mean.loss, Shape{}, {480.0}, "mean");
    testing::check_equal(cross_entropy(logits, target, -100, LossReduction::kSum, 0.5).loss, Shape{}, {960.0}, "sum");
    testing::check_equal(cross_entropy_backward(full({}, 1.0, kFloat32, kGpu), logits, target, mean.logsumexp, -100,
                                                LossReduction::kMean, 0.5),
                         Shape{3, 4},
                         {0.1875, -0.0625, -0.0625, -0.0625, 0.4375, -0.3125, -0.0625, -0.0625, 0, 0, 0, 0}, "grad");
  }
}

TEST_CASE("CUDA cross_entropy: every row ignored, and a bad target", "[gpu]") {
  const Tensor logits = random_tensor({4, 5}, kFloat32, 3).to(kGpu);
  const Tensor ignored = full({4}, -100.0, kInt64, kGpu);
  CHECK(std::isnan(to_f64(cross_entropy(logits, ignored).loss)[0]));
  CHECK(to_f64(cross_entropy(logits, ignored, -100, LossReduction::kSum).loss)[0] == 0.0);
  CHECK_THROWS_MATCHES(cross_entropy(logits, full({4}, 5.0, kInt64, kGpu)), IndexError,
                       testing::MessageContains("holds a class outside [0, 5)"));
}

}  // namespace
}  // namespace dtr
