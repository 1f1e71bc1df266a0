// relu's bit mask (kernels/relu_mask.h): the words hold exactly the bits the layout names
// (set where y is not <= 0: NaN set, -0 clear, the tail past numel clear), and masking a
// gradient with them gives relu_backward's bits, in every floating dtype, at sizes around
// a word and across threads; the checks name the operands. A [gpu] case (the
// relu_mask_gpu_test target) compares the CUDA kernels' words and gradients with the CPU's.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "kernels/relu_mask.h"
#include "tests/kernels/check_bitwise.h"
#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_bitwise;
using testing::random_tensor;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Element i's bit, read from the words as the layout states it.
bool bit(const Tensor& words, int64_t i) {
  const auto* w = reinterpret_cast<const uint32_t*>(words.data_ptr<int32_t>());
  return ((w[i / 32] >> (i % 32)) & 1U) != 0;
}

// Values with every sign case, random elsewhere: [i % 7] picks 0, -0, NaN, +inf, -inf or a
// random value of either sign.
Tensor signed_values(int64_t n, DType d, uint64_t seed) {
  std::vector<double> v = testing::to_f64(random_tensor({n}, kFloat64, seed, -2, 2));
  const double special[] = {0.0, -0.0, kNaN, kInf, -kInf};
  for (int64_t i = 0; i < n; i += 7) v[static_cast<size_t>(i)] = special[(i / 7) % 5];
  return Tensor::from_vector<double>(v).to(d);
}

TEST_CASE("relu_mask sets a bit where y is not <= 0, and applying it is relu_backward", "[relu_mask]") {
  testing::ThreadCountGuard guard;
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 31, 32, 33, 1000, 70001}) {
      for (DType d : testing::kFloatDTypes) {
        INFO(fmt::format("{} threads, {} elements of {}", threads, n, dtype_name(d)));
        const Tensor y = signed_values(n, d, static_cast<uint64_t>(n) + 1);
        const Tensor words = relu_mask(y);
        REQUIRE(words.shape() == Shape{(n + 31) / 32});
        REQUIRE(words.dtype() == kInt32);
        const std::vector<double> v = testing::to_f64(y);
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) wrong += bit(words, i) != !(v[static_cast<size_t>(i)] <= 0);
        for (int64_t i = n; i < 32 * words.numel(); ++i) wrong += bit(words, i);
        CHECK(wrong == 0);
        const Tensor g = random_tensor({n}, d, 7, -3, 3);
        Tensor masked = g.clone();
        apply_relu_mask_(masked, words);
        check_bitwise(masked, relu_backward(g, y), "the masked gradient against relu_backward");
      }
    }
  }
}

TEST_CASE("relu_mask's errors name the operands", "[relu_mask]") {
  CHECK_THROWS_AS(relu_mask(zeros({4, 6}).t()), ValueError);
  CHECK_THROWS_WITH(relu_mask(zeros({4, 6}).t()), Catch::Contains("relu_mask") && Catch::Contains("float32[6, 4]"));
  CHECK_THROWS_AS(relu_mask(zeros({3}, kInt32)), TypeError);
  Tensor g = zeros({40});
  CHECK_THROWS_WITH(apply_relu_mask_(g, relu_mask(zeros({8}))),
                    Catch::Contains("apply_relu_mask_") && Catch::Contains("int32[1]") &&
                        Catch::Contains("float32[40]") && Catch::Contains("int32[2]"));
  Tensor ints = zeros({8}, kInt64);
  CHECK_THROWS_AS(apply_relu_mask_(ints, relu_mask(zeros({8}))), TypeError);
  Tensor expanded = zeros({1, 8}).expand({4, 8});
  CHECK_THROWS_AS(apply_relu_mask_(expanded, relu_mask(zeros({32}))), ValueError);
}

TEST_CASE("CUDA relu_mask and apply_relu_mask_ equal the CPU's bit for bit", "[gpu]") {
  const Device gpu(kCUDA, 0);
  // 3 x 262144 + 5: past the kernels' grid of 1024 blocks of 256 threads three times, the
  // last pass ending inside a warp.
  for (int64_t n : {1, 31, 33, 4097, 3 * 262144 + 5}) {
    for (DType d : testing::kFloatDTypes) {
      INFO(fmt::format("{} elements of {}", n, dtype_name(d)));
      const Tensor y = signed_values(n, d, static_cast<uint64_t>(n));
      const Tensor words = relu_mask(y);
      const Tensor gpu_words = relu_mask(y.to(gpu));
      check_bitwise(gpu_words, words, "the words");
      const Tensor g = random_tensor({n}, d, 9, -3, 3);
      Tensor masked = g.clone(), gpu_masked = g.to(gpu);
      apply_relu_mask_(masked, words);
      apply_relu_mask_(gpu_masked, gpu_words);
      check_bitwise(gpu_masked, masked, "the masked gradient");
    }
  }
}

}  // namespace
}  // namespace dtr
