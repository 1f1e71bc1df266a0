// Reductions against float64 loops in this file: every claimed dtype, sizes 0, 1, 7,
// 1023, 4097, contiguous, strided and transposed inputs, any set of dims with and without
// keepdim, float32 accuracy at [2048, 1024] (column and row sums) and 4097 elements,
// bit-exact cases, empty dims (sum 0, mean NaN, max an error) and typed errors.
// sum_rows_accumulate over row chunks of multiples of 4 bit for bit as one sum.
#include "kernels/reduce.h"

#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "kernels/fill.h"
#include "tests/kernels/check_bitwise.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::check_equal;
using testing::kNumericDTypes;
using testing::random_tensor;
using testing::strided_copy;
using testing::to_f64;

constexpr DType kIntDTypes[] = {kInt32, kInt64};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Op { kSum, kMean, kMax, kMin, kSumOfSquares };

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kSum: return "sum";
    case Op::kMean: return "mean";
    case Op::kMax: return "max";
    case Op::kMin: return "min";
    case Op::kSumOfSquares: return "sum_of_squares";
  }
  return "?";
}

Tensor run(Op op, const Tensor& x, const std::vector<int64_t>& dims, KeepDim keepdim) {
  switch (op) {
    case Op::kSum: return sum(x, dims, keepdim);
    case Op::kMean: return mean(x, dims, keepdim);
    case Op::kMax: return max(x, dims, keepdim);
    case Op::kMin: return min(x, dims, keepdim);
    case Op::kSumOfSquares: return sum_of_squares(x, dims, keepdim);
  }
  return {};
}

// Which dims `dims` names in a tensor of rank nd (all for an empty list).
std::vector<bool> reduced_mask(int64_t nd, const std::vector<int64_t>& dims) {
  std::vector<bool> mask(nd, dims.empty());
  for (int64_t d : dims) mask[d < 0 ? d + nd : d] = true;
  return mask;
}

// `shape` without the dims `mask` names: a reduction's result without keepdim.
Shape without(const Shape& shape, const std::vector<bool>& mask) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d]) out.push_back(shape[d]);
  }
  return out;
}

// The float64 reference: x's values reduced over the masked dims, in keepdim row-major order.
std::vector<double> reference(Op op, const Tensor& x, const std::vector<bool>& reduced) {
  const std::vector<double> v = to_f64(x);
  const int64_t nd = x.dim();
  Shape out_shape = x.shape();
  for (int64_t d = 0; d < nd; ++d) {
    if (reduced[d]) out_shape[d] = 1;
  }
  const int64_t out_numel = shape_numel(out_shape);
  std::vector<double> acc(out_numel, op == Op::kMax ? -kInf : op == Op::kMin ? kInf : 0.0);
  std::vector<int64_t> count(out_numel, 0);
  for (int64_t flat = 0; flat < static_cast<int64_t>(v.size()); ++flat) {
    // Row-major multi-index of flat, folded into the output index.
    int64_t rest = flat, out = 0, out_stride = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      const int64_t i = rest % x.size(d);
      rest /= x.size(d);
      if (!reduced[d]) out += i * out_stride;
      out_stride *= out_shape[d];
    }
    double& a = acc[out];
    switch (op) {
      case Op::kSum:
      case Op::kMean: a += v[flat]; break;
      case Op::kSumOfSquares: a += v[flat] * v[flat]; break;
      case Op::kMax:
        if (!std::isnan(a) && (std::isnan(v[flat]) || v[flat] > a)) a = v[flat];
        break;
      case Op::kMin:
        if (!std::isnan(a) && (std::isnan(v[flat]) || v[flat] < a)) a = v[flat];
        break;
    }
    ++count[out];
  }
  if (op == Op::kMean) {
    for (int64_t o = 0; o < out_numel; ++o) acc[o] /= static_cast<double>(count[o]);  // 0 / 0 = NaN
  }
  return acc;
}

struct Case {
  std::string layout;
  Tensor x;
  std::vector<std::vector<int64_t>> dim_sets;
};

// Every awkward size in several layouts, each with the dim sets to reduce.
std::vector<Case> inputs(DType dtype, double lo, double hi) {
  uint64_t seed = 1;
  auto r = [&](Shape s) { return random_tensor(std::move(s), dtype, ++seed, lo, hi); };
  std::vector<Case> cases{{"0-d", r({}), {{}, {0}}}};
  for (int64_t n : testing::kAwkwardSizes) {
    cases.push_back({fmt::format("[{}]", n), r({n}), {{}, {0}, {-1}}});
    cases.push_back({fmt::format("strided [{}]", n), strided_copy(r({n})), {{}}});
    cases.push_back({fmt::format("[{}, 3]", n), r({n, 3}), {{0}, {1}, {-1}, {0, 1}, {}}});
    cases.push_back({fmt::format("strided [{}, 3]", n), strided_copy(r({n, 3})), {{0}, {1}}});
    cases.push_back({fmt::format("transposed [{}, 3]", n), r({3, n}).t(), {{0}, {1}, {}}});
    cases.push_back({fmt::format("[2, {}, 3]", n), r({2, n, 3}), {{1}, {0, 2}, {2, 0}}});
    cases.push_back({fmt::format("permuted [3, 2, {}]", n), r({2, n, 3}).permute({2, 0, 1}), {{0}, {2}, {0, 1}}});
  }
  return cases;
}

void check_op(Op op, std::span<const DType> dtypes, double lo = -1, double hi = 1) {
  for (DType dtype : dtypes) {
    for (const Case& c : inputs(dtype, lo, hi)) {
      for (const std::vector<int64_t>& dims : c.dim_sets) {
        const std::vector<bool> mask = reduced_mask(std::max<int64_t>(c.x.dim(), 1), dims);
        bool empty_dim = false;
        for (int64_t d = 0; d < c.x.dim(); ++d) empty_dim |= mask[d] && c.x.size(d) == 0;
        const std::string what = fmt::format("{} {} {} dims {}", op_name(op), dtype_name(dtype), c.layout, dims);
        if (empty_dim && (op == Op::kMax || op == Op::kMin)) {
          INFO(what);
          CHECK_THROWS_AS(run(op, c.x, dims, KeepDim::kNo), ValueError);
          continue;
        }
        const std::vector<double> expected = reference(op, c.x, mask);
        const Tensor kept = run(op, c.x, dims, KeepDim::kYes);
        const Tensor dropped = run(op, c.x, dims, KeepDim::kNo);
        Shape kept_shape = c.x.shape(), dropped_shape;
        for (int64_t d = 0; d < c.x.dim(); ++d) {
          if (mask[d])
            kept_shape[d] = 1;
          else
            dropped_shape.push_back(c.x.size(d));
        }
        const DType out_dtype = op == Op::kSum && !is_floating(dtype) ? kInt64 : dtype;
        INFO(what);
        CHECK(kept.shape() == kept_shape);
        CHECK(dropped.shape() == dropped_shape);
        CHECK(kept.dtype() == out_dtype);
        check_close(kept, kept_shape, expected, what + " keepdim");
        check_close(dropped, dropped_shape, expected, what);
      }
    }
  }
}

TEST_CASE("sum, mean, max, min and sum_of_squares match float64 loops", "[reduce]") {
  check_op(Op::kSum, testing::kAllDTypes);
  check_op(Op::kSum, kIntDTypes, -1000, 1000);
  check_op(Op::kMean, testing::kFloatDTypes);
  check_op(Op::kMax, testing::kAllDTypes);
  check_op(Op::kMin, testing::kAllDTypes);
  check_op(Op::kMax, kIntDTypes, -1000, 1000);
  check_op(Op::kSumOfSquares, testing::kFloatDTypes);
}

TEST_CASE("float32 sums are accurate to 1e-5 at 4097 elements and over a [2048, 1024] matrix", "[reduce][accuracy]") {
  const Tensor long_row = random_tensor({4097}, kFloat32, 11, 0.5, 1.5);  // no cancellation to hide behind
  check_close(sum(long_row), Shape{}, reference(Op::kSum, long_row, {true}), {0, 1e-6}, "sum of 4097");
  const Tensor m = random_tensor({2048, 1024}, kFloat32, 12);
  const testing::Tolerance tol{1e-5, 1e-5};
  for (Op op : {Op::kSum, Op::kMean, Op::kSumOfSquares}) {
    const std::vector<int64_t> dim_sets[] = {{0}, {1}, {}};
    for (const std::vector<int64_t>& dims : dim_sets) {
      const std::string what = fmt::format("{} [2048, 1024] dims {}", op_name(op), dims);
      check_close(run(op, m, dims, KeepDim::kNo), without(m.shape(), reduced_mask(2, dims)),
                  reference(op, m, reduced_mask(2, dims)), tol, what);
      check_close(run(op, m.t(), dims, KeepDim::kNo), without(m.t().shape(), reduced_mask(2, dims)),
                  reference(op, m.t(), reduced_mask(2, dims)), tol, what + " transposed");
    }
  }
}

TEST_CASE("argmax returns the first index of the maximum", "[reduce][argmax]") {
  for (DType dtype : kNumericDTypes) {
    // Integer values in [-3, 3): ties are frequent, so "first" is exercised.
    auto r = [&](Shape s, uint64_t seed) { return random_tensor(std::move(s), kInt64, seed, -3, 3).to(dtype); };
    for (int64_t n : testing::kAwkwardSizes) {
      if (n == 0) continue;
      const Tensor cases[] = {r({n}, 1), strided_copy(r({n, 3}, 2)), r({3, n}, 3).t(), r({2, n, 3}, 4)};
      for (const Tensor& x : cases) {
        for (int64_t dim = -x.dim(); dim < x.dim(); ++dim) {
          const int64_t d = dim < 0 ? dim + x.dim() : dim;
          if (x.size(d) == 0) continue;
          // Reference: scan dim for every position of the others.
          const std::vector<double> v = to_f64(x);
          Shape out_shape = x.shape();
          out_shape[d] = 1;
          const Shape strides = contiguous_strides(x.shape());
          std::vector<double> expected;
          for (int64_t o = 0; o < shape_numel(out_shape); ++o) {
            int64_t rest = o, base = 0;
            for (int64_t k = x.dim() - 1; k >= 0; --k) {
              base += (rest % out_shape[k]) * strides[k];
              rest /= out_shape[k];
            }
            int64_t best = 0;
            for (int64_t k = 1; k < x.size(d); ++k) {
              if (v[base + k * strides[d]] > v[base + best * strides[d]]) best = k;
            }
            expected.push_back(static_cast<double>(best));
          }
          const std::string what = fmt::format("argmax {} {} dim {}", dtype_name(dtype), describe(x), dim);
          const Tensor kept = argmax(x, dim, KeepDim::kYes);
          INFO(what);
          CHECK(kept.dtype() == kInt64);
          CHECK(kept.shape() == out_shape);
          check_equal(kept, out_shape, expected, what);
          check_equal(argmax(x, dim), without(x.shape(), reduced_mask(x.dim(), {d})), expected, what);
        }
      }
    }
  }
  check_equal(argmax(Tensor::from_vector<double>({1, kNaN, 3, kNaN}).to(kFloat32), 0), Shape{}, {1},
              "argmax: the first NaN is the max");
  // Long runs (several lanes of 64): ties and NaNs across lanes, along both dims of a matrix.
  std::vector<double> v(1000, 0.0);
  v[130] = v[65] = v[999] = 5;
  check_equal(argmax(Tensor::from_vector<double>(v).to(kFloat32), 0), Shape{}, {65},
              "argmax: first of ties across lanes");
  v[900] = v[700] = kNaN;
  const Tensor column = Tensor::from_vector<double>(v).to(kBFloat16).view({1000, 1});
  check_equal(argmax(column, 0), Shape{1}, {700}, "argmax: first NaN across lanes");
  check_equal(argmax(column.expand({1000, 3}).contiguous(), 0), Shape{3}, {700, 700, 700}, "argmax of dim 0 by slices");
  check_equal(argmax(full({}, 5.0), 0), Shape{}, {0}, "argmax of a 0-d tensor");
  CHECK(argmax(full({}, 5.0), 0).dim() == 0);
}

TEST_CASE("small integers reduce bit exactly in every floating dtype", "[reduce][exact]") {
  for (DType d : testing::kFloatDTypes) {
    const Tensor x = arange(8, d).view({2, 4});  // [[0, 1, 2, 3], [4, 5, 6, 7]]
    const std::string dn(dtype_name(d));
    check_equal(sum(x), Shape{}, {28}, "sum " + dn);
    check_equal(sum(x, {0}), Shape{4}, {4, 6, 8, 10}, "column sums " + dn);
    check_equal(sum(x, {1}), Shape{2}, {6, 22}, "row sums " + dn);
    check_equal(mean(x), Shape{}, {3.5}, "mean " + dn);
    check_equal(mean(x, {1}), Shape{2}, {1.5, 5.5}, "row means " + dn);
    check_equal(max(x, {0}), Shape{4}, {4, 5, 6, 7}, "max " + dn);
    check_equal(min(x, {1}), Shape{2}, {0, 4}, "min " + dn);
    check_equal(sum_of_squares(x), Shape{}, {140}, "sum_of_squares " + dn);
    check_equal(argmax(x, 1), Shape{2}, {3, 3}, "argmax " + dn);
  }
  check_equal(sum(full({5}, 1.0, kBool)), Shape{}, {5}, "sum of bools counts them");
  check_equal(max(Tensor::from_vector<double>({1, kNaN, 3}).to(kFloat32)), Shape{}, {kNaN}, "max propagates NaN");
  check_equal(min(Tensor::from_vector<double>({1, kNaN, -3}).to(kFloat32)), Shape{}, {kNaN}, "min propagates NaN");
  const Tensor big = full({3}, 2147483647.0, kInt32);
  check_equal(sum(big), Shape{}, {3.0 * 2147483647}, "int32 sums accumulate in int64");
}

TEST_CASE("reducing an empty dim: sum 0, mean NaN, max, min and argmax raise", "[reduce][empty]") {
  const Tensor e = zeros({3, 0});
  check_equal(sum(e, {1}), Shape{3}, {0, 0, 0}, "sum over an empty dim");
  check_equal(mean(e, {1}), Shape{3}, {kNaN, kNaN, kNaN}, "mean over an empty dim");
  CHECK(sum(e, {0}).shape() == Shape{0});
  CHECK(max(e, {0}).shape() == Shape{0});  // the reduced dim has size 3: nothing is empty
  CHECK_THROWS_AS(max(e, {1}), ValueError);
  CHECK_THROWS_WITH(max(e, {1}), Catch::Contains("max") && Catch::Contains("float32[3, 0]") &&
                                     Catch::Contains("dim 1") && Catch::Contains("size 0"));
  CHECK_THROWS_WITH(min(e), Catch::Contains("min") && Catch::Contains("float32[3, 0]"));
  CHECK_THROWS_WITH(argmax(e, 1), Catch::Contains("argmax") && Catch::Contains("float32[3, 0]"));
}

TEST_CASE("sum_rows_accumulate over row chunks of multiples of 4 is one sum bit for bit", "[reduce][accumulate]") {
  for (DType dtype : testing::kFloatDTypes) {
    const DType acc_dtype = dtype == kFloat32 || dtype == kFloat64 ? kFloat64 : kFloat32;
    const Tensor x = random_tensor({1031, 67}, dtype, 51);  // a partial last chunk
    for (int64_t chunk : {4, 256, 512}) {
      INFO("dtype " << dtype_name(dtype) << ", chunks of " << chunk << " rows");
      const Tensor acc = zeros({67}, acc_dtype);
      for (int64_t begin = 0; begin < x.size(0); begin += chunk) {
        sum_rows_accumulate(acc, x.narrow(0, begin, std::min(chunk, x.size(0) - begin)));
      }
      testing::check_bitwise(acc.to(dtype), sum(x, {0}), "chunked row sums");
    }
  }
  CHECK_THROWS_WITH(sum_rows_accumulate(zeros({67}, kFloat32), random_tensor({8, 67}, kFloat32, 1)),
                    Catch::Contains("sum_rows_accumulate") && Catch::Contains("float64") && Catch::Contains("[67]"));
  CHECK_THROWS_AS(sum_rows_accumulate(zeros({66}, kFloat64), random_tensor({8, 67}, kFloat32, 1)), ValueError);
}

TEST_CASE("bad dims and dtypes raise typed errors naming the op, shape and dtype", "[reduce][errors]") {
  const Tensor x = zeros({2, 3}, kBFloat16);
  CHECK_THROWS_AS(sum(x, {2}), IndexError);
  CHECK_THROWS_WITH(sum(x, {2}),
                    Catch::Contains("sum") && Catch::Contains("dim 2") && Catch::Contains("bfloat16[2, 3]"));
  CHECK_THROWS_AS(argmax(x, -3), IndexError);
  CHECK_THROWS_WITH(argmax(x, -3), Catch::Contains("argmax") && Catch::Contains("bfloat16[2, 3]"));
  CHECK_THROWS_AS(mean(x, {1, -1}), ValueError);
  CHECK_THROWS_WITH(mean(x, {1, -1}),
                    Catch::Contains("mean") && Catch::Contains("more than once") && Catch::Contains("bfloat16[2, 3]"));
  CHECK_THROWS_AS(mean(zeros({3}, kInt32)), NotImplementedError);
  CHECK_THROWS_WITH(mean(zeros({3}, kInt32)), Catch::Contains("mean") && Catch::Contains("int32"));
  CHECK_THROWS_AS(sum_of_squares(zeros({3}, kInt64)), NotImplementedError);
  CHECK_THROWS_AS(sum(Tensor()), ValueError);
}

}  // namespace
}  // namespace dtr
