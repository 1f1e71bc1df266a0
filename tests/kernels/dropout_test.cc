// dropout and dropout_backward: the mask is bernoulli(1 - p) at each element's global index
// (the same on a shard as on the whole tensor), y and grad_x against float64 loops for every
// floating dtype, sizes 0/1/7/1023/4097 and strided inputs; exact at p = 0.5; p = 0 and 1;
// the kept fraction; typed errors.
#include "kernels/dropout.h"

#include <cmath>

#include "kernels/random.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::to_f64;

// x * mask * scale elementwise, in float64.
std::vector<double> reference_masked(const std::vector<double>& x, const std::vector<double>& mask, double scale) {
  std::vector<double> out;
  for (size_t i = 0; i < x.size(); ++i) out.push_back(mask[i] != 0.0 ? x[i] * scale : 0.0);
  return out;
}

TEST_CASE("dropout keeps x / (1 - p) where bernoulli(1 - p) says so", "[dropout]") {
  uint64_t seed = 1;
  for (DType dtype : testing::kFloatDTypes) {
    for (int64_t n : testing::kAwkwardSizes) {
      for (double p : {0.1, 0.5, 0.9}) {
        Tensor x = testing::random_tensor({3, n}, dtype, seed++);
        Tensor g = testing::random_tensor({3, n}, dtype, seed++);
        const std::string what = fmt::format("dropout p {} of {}", p, describe(x));
        for (const Tensor& input : {x, testing::strided_copy(x)}) {
          DropoutOutput out = dropout(input, p, 42);
          CHECK(out.mask.dtype() == kBool);
          CHECK(out.y.shape() == x.shape());
          const std::vector<double> mask = to_f64(out.mask);
          testing::check_equal(out.mask, bernoulli({3, n}, 1.0 - p, 42, kBool), what + " mask");
          testing::check_close(out.y, x.shape(), reference_masked(to_f64(x), mask, 1.0 / (1.0 - p)), what + " y");
          testing::check_close(dropout_backward(testing::strided_copy(g), out.mask, p), x.shape(),
                               reference_masked(to_f64(g), mask, 1.0 / (1.0 - p)), what + " grad_x");
        }
      }
    }
  }
}

TEST_CASE("a shard's dropout mask is its slice of the whole tensor's mask", "[dropout]") {
  for (DType dtype : testing::kFloatDTypes) {
    Tensor x = testing::random_tensor({8, 6}, dtype, 5);
    DropoutOutput whole = dropout(x, 0.3, 77);
    Tensor shard = x.slice(1, 2, 5).contiguous();
    DropoutOutput part = dropout(shard, 0.3, 77, ShardLayout{{8, 6}, {0, 2}});
    testing::check_equal(part.mask, whole.mask.slice(1, 2, 5), "mask of the [0:8, 2:5] block");
    testing::check_equal(part.y, whole.y.slice(1, 2, 5), "y of the [0:8, 2:5] block");
  }
}

TEST_CASE("dropout at p = 0.5 doubles kept values exactly", "[dropout][exact]") {
  for (DType dtype : testing::kFloatDTypes) {
    Tensor x = testing::random_tensor({1023}, dtype, 9);
    DropoutOutput out = dropout(x, 0.5, 3);
    const std::vector<double> mask = to_f64(out.mask);
    testing::check_equal(out.y, x.shape(), reference_masked(to_f64(x), mask, 2.0), "y = 2x or 0");
    testing::check_equal(dropout_backward(x, out.mask, 0.5), x.shape(), reference_masked(to_f64(x), mask, 2.0),
                         "grad = 2g or 0");
  }
}

TEST_CASE("dropout with p = 0 returns x; p = 1 returns zeros", "[dropout]") {
  for (DType dtype : testing::kFloatDTypes) {
    Tensor x = testing::random_tensor({7, 5}, dtype, 11);
    DropoutOutput keep = dropout(x, 0.0, 1);
    CHECK(keep.y.storage().is_same(x.storage()));
    testing::check_equal(keep.mask, x.shape(), std::vector<double>(35, 1.0), "p = 0 mask");
    CHECK(dropout_backward(x, keep.mask, 0.0).storage().is_same(x.storage()));
    DropoutOutput drop = dropout(x, 1.0, 1);
    testing::check_equal(drop.y, x.shape(), std::vector<double>(35, 0.0), "p = 1 y");
    testing::check_equal(drop.mask, x.shape(), std::vector<double>(35, 0.0), "p = 1 mask");
    testing::check_equal(dropout_backward(x, drop.mask, 1.0), x.shape(), std::vector<double>(35, 0.0), "p = 1 grad");
  }
}

TEST_CASE("dropout keeps a fraction 1 - p of 1e5 elements, within 5 standard errors", "[dropout][statistics]") {
  const int64_t n = 100000;
  for (double p : {0.1, 0.5, 0.8}) {
    std::vector<double> mask = to_f64(dropout(ones({n}), p, 123).mask);
    double kept = 0.0;
    for (double m : mask) kept += m;
    CHECK(std::abs(kept / n - (1.0 - p)) < 5.0 * std::sqrt(p * (1.0 - p) / n));
  }
}

TEST_CASE("dropout rejects bad arguments with typed errors", "[dropout][errors]") {
  Tensor x = ones({4, 3});
  CHECK_THROWS_AS(dropout(x, -0.1, 1), ValueError);
  CHECK_THROWS_WITH(dropout(x, 1.5, 1), Catch::Contains("dropout") && Catch::Contains("1.5") &&
                                            Catch::Contains("[0, 1]") && Catch::Contains("float32[4, 3]"));
  CHECK_THROWS_AS(dropout(ones({4}, kInt64), 0.5, 1), TypeError);
  CHECK_THROWS_WITH(dropout(x, 0.5, 1, ShardLayout{{4, 2}, {0, 0}}),
                    Catch::Contains("dropout") && Catch::Contains("[4, 2]"));
  DropoutOutput out = dropout(x, 0.5, 1);
  CHECK_THROWS_WITH(dropout_backward(x, out.mask.to(kFloat32), 0.5),
                    Catch::Contains("dropout_backward") && Catch::Contains("mask"));
  CHECK_THROWS_AS(dropout_backward(ones({3, 4}), out.mask, 0.5), ValueError);
  CHECK_THROWS_AS(dropout_backward(x, out.mask, 2.0), ValueError);
}

}  // namespace
}  // namespace dtr
