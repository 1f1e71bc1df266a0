// The CUDA reductions (kernels/cuda/reduce.h) against the CPU kernels on the same random
// inputs: sum, mean, max, min and sum_of_squares over every dim, the last, the first, a
// middle one, two apart, and all of them, with keepdim, in every dtype each takes; on
// contiguous and transposed inputs; shapes that take the warp-per-output kernel (many short
// rows) and the block-per-output one (few long ones, a million elements); NaN in max/min;
// empty inputs; argmax with ties and NaN. Tagged gpu (Bazel) and [gpu] (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <vector>

#include "kernels/fill.h"
#include "kernels/reduce.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::random_tensor;
using testing::to_f64;

const Device kGpu(kCUDA, 0);

using Reduction = Tensor (*)(const Tensor&, const std::vector<int64_t>&, KeepDim);

struct Op {
  const char* name;
  Reduction f;
  bool floating_only;
};

const Op kOps[] = {{"sum", sum, false},
                   {"mean", mean, true},
                   {"max", max, false},
                   {"min", min, false},
                   {"sum_of_squares", sum_of_squares, true}};

TEST_CASE("CUDA reductions match the CPU over every set of dims, dtype and layout", "[gpu]") {
  uint64_t seed = 1;
  for (const Op& op : kOps) {
    for (DType d : testing::kAllDTypes) {
      if (op.floating_only && !is_floating(d)) continue;
      for (const Shape& shape : std::vector<Shape>{{7}, {4097, 3}, {3, 5, 1023}, {2, 6, 8, 33}}) {
        const Tensor x = random_tensor(shape, d, seed++, -4, 4);
        const int64_t n = static_cast<int64_t>(shape.size());
        std::vector<std::vector<int64_t>> dim_sets = {{}, {-1}, {0}};
        if (n >= 3) dim_sets.push_back({1});
        if (n >= 3) dim_sets.push_back({0, 2});
        for (const auto& dims : dim_sets) {
          for (KeepDim keep : {KeepDim::kNo, KeepDim::kYes}) {
            const std::string what = fmt::format("{} {} {} dims {} keepdim {}", op.name, dtype_name(d), shape,
                                                 fmt::join(dims, ","), keep == KeepDim::kYes);
            const Tensor expected = op.f(x, dims, keep);
            const Tensor got = op.f(x.to(kGpu), dims, keep);
            REQUIRE(got.shape() == expected.shape());
            REQUIRE(got.dtype() == expected.dtype());
            check_close(got, expected, what);
            // A transposed input: the reduced elements are strided.
            const Tensor xt = x.transpose(0, n - 1);
            check_close(op.f(x.to(kGpu).transpose(0, n - 1), dims, keep), op.f(xt, dims, keep), what + " transposed");
          }
        }
      }
    }
  }
}

TEST_CASE("CUDA reductions: a million elements, NaN, empty dims", "[gpu]") {
  const Tensor big = random_tensor({1 << 20}, kFloat32, 9, -1, 1);
  check_close(sum(big.to(kGpu)), sum(big), {1e-6, 1e-6}, "sum of 2^20");
  check_close(sum_of_squares(big.to(kGpu)), sum_of_squares(big), {1e-6, 1e-6}, "sum of squares of 2^20");
  Tensor with_nan = random_tensor({4, 9}, kFloat32, 10);
  with_nan.data_ptr<float>()[13] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<double> m = to_f64(max(with_nan.to(kGpu), {1}));
  CHECK(std::isnan(m[1]));
  CHECK(!std::isnan(m[0]));
  CHECK(std::isnan(to_f64(min(with_nan.to(kGpu)))[0]));
  const Tensor empty = zeros({0, 3}, kFloat32, kGpu);
  CHECK(to_f64(sum(empty, {0})) == std::vector<double>(3, 0.0));
  CHECK(std::isnan(to_f64(mean(empty, {0}))[0]));
  CHECK(to_f64(sum(ones({5}, kInt32, kGpu))) == std::vector<double>{5.0});
  CHECK(sum(ones({5}, kInt32, kGpu)).dtype() == kInt64);
}

TEST_CASE("CUDA argmax matches the CPU along every dim, with ties and NaN", "[gpu]") {
  uint64_t seed = 100;
  for (DType d : testing::kNumericDTypes) {
    for (const Shape& shape : std::vector<Shape>{{7}, {4097, 3}, {3, 5, 1023}}) {
      // Integers in [-3, 3): many ties, so the first maximum is what is checked.
      const Tensor x = random_tensor(shape, d, seed++, -3, 3);
      for (int64_t dim = 0; dim < static_cast<int64_t>(shape.size()); ++dim) {
        INFO(dtype_name(d) << " " << fmt::format("{}", shape) << " dim " << dim);
        CHECK(to_f64(argmax(x.to(kGpu), dim)) == to_f64(argmax(x, dim)));
        CHECK(to_f64(argmax(x.to(kGpu).transpose(0, shape.size() - 1), dim)) ==
              to_f64(argmax(x.transpose(0, shape.size() - 1), dim)));
      }
    }
  }
  Tensor with_nan = random_tensor({2, 9}, kFloat32, 11);
  with_nan.data_ptr<float>()[4] = std::numeric_limits<float>::quiet_NaN();
  with_nan.data_ptr<float>()[6] = std::numeric_limits<float>::quiet_NaN();
  CHECK(to_f64(argmax(with_nan.to(kGpu), 1)) == to_f64(argmax(with_nan, 1)));
  CHECK(to_f64(argmax(with_nan.to(kGpu), 1))[0] == 4.0);
}

}  // namespace
}  // namespace dtr
