// Elementwise ops against float64 references computed in this file: every dtype each op
// claims, sizes 0, 1, 7, 1023, 4097, contiguous, strided and transposed inputs,
// broadcasting ([4, 1, 3] with [2, 3], 0-d with [n]), bit-exact cases with exactly
// representable answers, typed errors, in-place writes through views, and maps split
// across threads (bitwise equal to one thread).
#include "kernels/elementwise.h"

#include <cmath>
#include <limits>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "kernels/fill.h"
#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::check_equal;
using testing::kNumericDTypes;
using testing::random_tensor;
using testing::strided_copy;
using testing::to_f64;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Values drawn uniformly from [lo, hi); kIntegers floors them (so that comparisons see ties).
struct Range {
  double lo = -3;
  double hi = 3;
  enum Values { kReal, kIntegers } values = kReal;
};

Tensor random_in(Shape shape, DType dtype, uint64_t seed, Range r) {
  if (r.values == Range::kIntegers) return random_tensor(std::move(shape), kInt64, seed, r.lo, r.hi).to(dtype);
  return random_tensor(std::move(shape), dtype, seed, r.lo, r.hi);
}

struct UnaryCase {
  std::string layout;
  Tensor x;
};

// Every awkward size as a contiguous [n], a strided view [n] and a transposed [n, 3]; plus a 0-d tensor.
std::vector<UnaryCase> unary_inputs(DType dtype, Range r) {
  uint64_t seed = 1;
  std::vector<UnaryCase> cases{{"0-d", random_in({}, dtype, seed, r)}};
  for (int64_t n : testing::kAwkwardSizes) {
    cases.push_back({fmt::format("contiguous [{}]", n), random_in({n}, dtype, ++seed, r)});
    cases.push_back({fmt::format("strided [{}]", n), strided_copy(random_in({n}, dtype, ++seed, r))});
    cases.push_back({fmt::format("transposed [{}, 3]", n), random_in({3, n}, dtype, ++seed, r).t()});
  }
  return cases;
}

struct BinaryCase {
  std::string layout;
  Tensor a;
  Tensor b;
};

// Same-shape pairs in every layout, and broadcasting pairs, for every awkward size.
std::vector<BinaryCase> binary_inputs(DType dtype, Range ra, Range rb) {
  uint64_t seed = 100;
  auto a = [&](Shape s) { return random_in(std::move(s), dtype, ++seed, ra); };
  auto b = [&](Shape s) { return random_in(std::move(s), dtype, ++seed, rb); };
  std::vector<BinaryCase> cases{{"[4, 1, 3] with [2, 3]", a({4, 1, 3}), b({2, 3})},
                                {"[2, 3] with [4, 1, 3]", a({2, 3}), b({4, 1, 3})}};
  for (int64_t n : testing::kAwkwardSizes) {
    cases.push_back({fmt::format("contiguous [{}]", n), a({n}), b({n})});
    cases.push_back({fmt::format("strided [{}]", n), strided_copy(a({n})), strided_copy(b({n}))});
    cases.push_back({fmt::format("transposed [{}, 3]", n), a({3, n}).t(), b({3, n}).t()});
    cases.push_back({fmt::format("[{}, 3] with strided [3]", n), a({n, 3}), strided_copy(b({3}))});
    cases.push_back({fmt::format("0-d with [{}]", n), a({}), b({n})});
    cases.push_back({fmt::format("[{}, 1] with [1, 5]", n), a({n, 1}), b({1, 5})});
  }
  return cases;
}

std::string label(std::string_view op, DType dtype, const std::string& layout) {
  return fmt::format("{} {} {}", op, dtype_name(dtype), layout);
}

// op(x) == ref(x) elementwise, within the output dtype's tolerance.
template <class Op, class Ref>
void check_unary(std::string_view name, std::span<const DType> dtypes, const Op& op, const Ref& ref, Range r = {}) {
  for (DType dtype : dtypes) {
    for (const UnaryCase& c : unary_inputs(dtype, r)) {
      const Tensor y = op(c.x);
      REQUIRE(y.shape() == c.x.shape());
      std::vector<double> expected;
      for (double v : to_f64(c.x)) expected.push_back(ref(v));
      check_close(y, c.x.shape(), expected, label(name, dtype, c.layout));
    }
  }
}

// op(a, b) == ref(a, b) elementwise over the broadcast shape; out_dtype defaults to a's.
// The tolerance is the output dtype's, raised to at least `floor`.
template <class Op, class Ref>
void check_binary(std::string_view name, std::span<const DType> dtypes, const Op& op, const Ref& ref, Range ra = {},
                  Range rb = {}, std::optional<DType> out_dtype = {}, testing::Tolerance floor = {0, 0}) {
  for (DType dtype : dtypes) {
    for (const BinaryCase& c : binary_inputs(dtype, ra, rb)) {
      const Shape shape = broadcast_shapes(c.a.shape(), c.b.shape(), "test");
      const Tensor y = op(c.a, c.b);
      REQUIRE(y.shape() == shape);
      REQUIRE(y.dtype() == out_dtype.value_or(dtype));
      const std::vector<double> a = to_f64(c.a.expand(shape)), b = to_f64(c.b.expand(shape));
      std::vector<double> expected;
      for (size_t i = 0; i < a.size(); ++i) expected.push_back(ref(a[i], b[i]));
      const testing::Tolerance tol = testing::tolerance_for(y.dtype());
      check_close(y, shape, expected, {std::max(tol.atol, floor.atol), std::max(tol.rtol, floor.rtol)},
                  label(name, dtype, c.layout));
    }
  }
}

double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }
double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
// Central differences of the forward references: good to about 1e-9 relative, which is
// the tolerance floor of the backward checks (it only matters for float64).
template <class F>
double derivative(const F& f, double x) {
  constexpr double h = 1e-5;
  return (f(x + h) - f(x - h)) / (2 * h);
}
constexpr testing::Tolerance kDerivativeTolerance{1e-9, 1e-7};

TEST_CASE("binary arithmetic matches float64 references over sizes, layouts and broadcasting", "[elementwise]") {
  check_binary(
      "add", kNumericDTypes, [](auto& a, auto& b) { return add(a, b); }, std::plus<>());
  check_binary(
      "sub", kNumericDTypes, [](auto& a, auto& b) { return sub(a, b); }, std::minus<>());
  check_binary(
      "mul", kNumericDTypes, [](auto& a, auto& b) { return mul(a, b); }, std::multiplies<>());
  check_binary(
      "div", testing::kFloatDTypes, [](auto& a, auto& b) { return div(a, b); }, std::divides<>(), Range{},
      Range{0.5, 2});
  check_binary(
      "maximum", kNumericDTypes, [](auto& a, auto& b) { return maximum(a, b); },
      [](double a, double b) { return std::max(a, b); });
  check_binary(
      "minimum", kNumericDTypes, [](auto& a, auto& b) { return minimum(a, b); },
      [](double a, double b) { return std::min(a, b); });
}

TEST_CASE("tensor-scalar arithmetic and pow match float64 references", "[elementwise]") {
  check_unary(
      "add 2", kNumericDTypes, [](auto& x) { return add(x, 2.0); }, [](double v) { return v + 2; });
  check_unary(
      "sub 3", kNumericDTypes, [](auto& x) { return sub(x, 3.0); }, [](double v) { return v - 3; });
  check_unary(
      "mul -4", kNumericDTypes, [](auto& x) { return mul(x, -4.0); }, [](double v) { return v * -4; });
  check_unary(
      "rsub 1", kNumericDTypes, [](auto& x) { return rsub(x, 1.0); }, [](double v) { return 1 - v; });
  check_unary(
      "div 3", testing::kFloatDTypes, [](auto& x) { return div(x, 3.0); }, [](double v) { return v / 3; });
  check_unary(
      "mul 0.1", testing::kFloatDTypes, [](auto& x) { return mul(x, 0.1); }, [](double v) { return v * 0.1; });
  for (double e : {2.0, 3.0, 0.5, -1.5}) {
    check_unary(
        fmt::format("pow {}", e), testing::kFloatDTypes, [e](auto& x) { return pow(x, e); },
        [e](double v) { return std::pow(v, e); }, Range{0.25, 3});
  }
}

TEST_CASE("unary ops match float64 references", "[elementwise]") {
  check_unary(
      "neg", kNumericDTypes, [](auto& x) { return neg(x); }, [](double v) { return -v; });
  check_unary(
      "abs", kNumericDTypes, [](auto& x) { return abs(x); }, [](double v) { return std::abs(v); });
  check_unary(
      "relu", kNumericDTypes, [](auto& x) { return relu(x); }, [](double v) { return std::max(v, 0.0); });
  const auto& floats = testing::kFloatDTypes;
  check_unary(
      "exp", floats, [](auto& x) { return exp(x); }, [](double v) { return std::exp(v); });
  const DType wide[] = {kFloat32, kFloat64};  // exp up to its float32 overflow point
  check_unary(
      "exp wide", wide, [](auto& x) { return exp(x); }, [](double v) { return std::exp(v); }, Range{-87, 88});
  for (DType d : floats) {
    const Tensor special = Tensor::from_vector<double>({-kInf, kInf, kNaN, -1000, 1000, 0}).to(d);
    check_equal(exp(special), Shape{6}, {0, kInf, kNaN, 0, kInf, 1}, fmt::format("exp of extremes, {}", dtype_name(d)));
    check_equal(sigmoid(special), Shape{6}, {0, 1, kNaN, 0, 1, 0.5},
                fmt::format("sigmoid of extremes, {}", dtype_name(d)));
  }
  check_unary(
      "log", floats, [](auto& x) { return log(x); }, [](double v) { return std::log(v); }, Range{0.1, 4});
  check_unary(
      "sqrt", floats, [](auto& x) { return sqrt(x); }, [](double v) { return std::sqrt(v); }, Range{0, 4});
  check_unary(
      "rsqrt", floats, [](auto& x) { return rsqrt(x); }, [](double v) { return 1 / std::sqrt(v); }, Range{0.1, 4});
  check_unary(
      "tanh", floats, [](auto& x) { return tanh(x); }, [](double v) { return std::tanh(v); });
  check_unary(
      "sigmoid", floats, [](auto& x) { return sigmoid(x); }, sigmoid_ref, Range{-8, 8});
  check_unary(
      "silu", floats, [](auto& x) { return silu(x); }, [](double v) { return v * sigmoid_ref(v); });
  check_unary(
      "gelu", floats, [](auto& x) { return gelu(x); }, gelu_ref);
  check_unary(
      "gelu tanh", floats, [](auto& x) { return gelu(x, GeluApproximation::kTanh); }, gelu_tanh_ref);
}

TEST_CASE("clamp takes optional bounds and keeps NaN", "[elementwise]") {
  check_unary(
      "clamp [-1, 2]", kNumericDTypes, [](auto& x) { return clamp(x, -1.0, 2.0); },
      [](double v) { return std::min(std::max(v, -1.0), 2.0); });
  check_unary(
      "clamp min 0", kNumericDTypes, [](auto& x) { return clamp(x, 0.0, std::nullopt); },
      [](double v) { return std::max(v, 0.0); });
  check_unary(
      "clamp max 1", kNumericDTypes, [](auto& x) { return clamp(x, std::nullopt, 1.0); },
      [](double v) { return std::min(v, 1.0); });
  const Tensor x = Tensor::from_vector<double>({kNaN, -kInf, kInf, -5, 5}).to(kFloat32);
  check_equal(clamp(x, -1.0, 2.0), Shape{5}, {kNaN, -1, 2, -1, 2}, "clamp of NaN and infinities");
  check_equal(clamp(x, 3.0, 1.0), Shape{5}, {kNaN, 1, 1, 1, 1}, "clamp with min > max gives max, as in torch");
}

TEST_CASE("fused backward kernels match derivatives of the forward references", "[elementwise]") {
  const auto& floats = testing::kFloatDTypes;
  const Range grad{-1, 1};
  check_binary(
      "relu_backward", floats, [](auto& g, auto& x) { return relu_backward(g, x); },
      [](double g, double x) { return x > 0 ? g : 0.0; }, grad);
  check_binary(
      "gelu_backward", floats, [](auto& g, auto& x) { return gelu_backward(g, x); },
      [](double g, double x) { return g * derivative(gelu_ref, x); }, grad, Range{}, std::nullopt,
      kDerivativeTolerance);
  check_binary(
      "gelu_backward tanh", floats, [](auto& g, auto& x) { return gelu_backward(g, x, GeluApproximation::kTanh); },
      [](double g, double x) { return g * derivative(gelu_tanh_ref, x); }, grad, Range{}, std::nullopt,
      kDerivativeTolerance);
  check_binary(
      "silu_backward", floats, [](auto& g, auto& x) { return silu_backward(g, x); },
      [](double g, double x) { return g * derivative([](double v) { return v * sigmoid_ref(v); }, x); }, grad, Range{},
      std::nullopt, kDerivativeTolerance);
  // The saved tensor is the forward output y; the reference differentiates through x.
  check_binary(
      "sigmoid_backward", floats, [](auto& g, auto& y) { return sigmoid_backward(g, y); },
      [](double g, double y) { return g * derivative(sigmoid_ref, std::log(y / (1 - y))); }, grad, Range{0.02, 0.98},
      std::nullopt, kDerivativeTolerance);
  check_binary(
      "tanh_backward", floats, [](auto& g, auto& y) { return tanh_backward(g, y); },
      [](double g, double y) { return g * derivative([](double v) { return std::tanh(v); }, std::atanh(y)); }, grad,
      Range{-0.98, 0.98}, std::nullopt, kDerivativeTolerance);
}

TEST_CASE("comparisons return bool tensors for every dtype", "[elementwise][compare]") {
  const Range ties{-2, 2, Range::kIntegers};
  struct Cmp {
    std::string_view name;
    Tensor (*tensor_op)(const Tensor&, const Tensor&);
    Tensor (*scalar_op)(const Tensor&, double);
    bool (*ref)(double, double);
  };
  const Cmp cmps[] = {
      {"eq", eq, eq, [](double a, double b) { return a == b; }},
      {"ne", ne, ne, [](double a, double b) { return a != b; }},
      {"lt", lt, lt, [](double a, double b) { return a < b; }},
      {"le", le, le, [](double a, double b) { return a <= b; }},
      {"gt", gt, gt, [](double a, double b) { return a > b; }},
      {"ge", ge, ge, [](double a, double b) { return a >= b; }},
  };
  for (const Cmp& c : cmps) {
    check_binary(
        c.name, testing::kAllDTypes, c.tensor_op, [&](double a, double b) { return double(c.ref(a, b)); }, ties, ties,
        kBool);
    check_unary(
        fmt::format("{} 1", c.name), testing::kAllDTypes, [&](auto& x) { return c.scalar_op(x, 1.0); },
        [&](double v) { return double(c.ref(v, 1.0)); }, ties);
  }
  // The scalar is rounded to the tensor's dtype first: a bf16 0.1 equals 0.1.
  const Tensor tenth = full({3}, 0.1, kBFloat16);
  check_equal(eq(tenth, 0.1), Shape{3}, {1, 1, 1}, "bf16 eq 0.1");
  check_equal(lt(tenth, 0.1), Shape{3}, {0, 0, 0}, "bf16 lt 0.1");
  const Tensor nan = Tensor::from_vector<double>({kNaN, 1}).to(kFloat32);
  check_equal(eq(nan, nan), Shape{2}, {0, 1}, "NaN != NaN");
  check_equal(ne(nan, nan), Shape{2}, {1, 0}, "NaN ne NaN");
}

TEST_CASE("logical_not, where and masked_fill select exactly", "[elementwise][select]") {
  const Range small{-2, 2, Range::kIntegers};
  check_unary(
      "logical_not", testing::kAllDTypes, [](auto& x) { return logical_not(x); },
      [](double v) { return double(v == 0); }, small);
  for (DType dtype : testing::kAllDTypes) {
    for (const BinaryCase& c : binary_inputs(dtype, Range{-9, 9}, Range{-9, 9})) {
      // The condition is the third operand, broadcast against both: take it as a's shape.
      const Tensor cond = random_tensor(c.a.shape(), kBool, 5);
      const Shape shape = broadcast_shapes(c.a.shape(), c.b.shape(), "test");
      const std::vector<double> k = to_f64(cond.expand(shape)), a = to_f64(c.a.expand(shape)),
                                b = to_f64(c.b.expand(shape));
      std::vector<double> expected;
      for (size_t i = 0; i < k.size(); ++i) expected.push_back(k[i] != 0 ? a[i] : b[i]);
      check_equal(where(cond, c.a, c.b), shape, expected, label("where", dtype, c.layout));
      // masked_fill's mask has x's shape here: the output keeps it.
      const std::vector<double> mask = to_f64(logical_not(cond)), x = to_f64(c.a);
      expected.clear();
      for (size_t i = 0; i < mask.size(); ++i) expected.push_back(mask[i] != 0 ? 1.0 : x[i]);
      check_equal(masked_fill(c.a, logical_not(cond), 1.0), c.a.shape(), expected,
                  label("masked_fill", dtype, c.layout));
    }
  }
  // A causal mask: [3, 3] scores, mask [3, 3] from a comparison of broadcast index tensors.
  const Tensor i = arange(3, kInt64).view({3, 1}), j = arange(3, kInt64).view({1, 3});
  const Tensor scores = full({3, 3}, 2.0);
  check_equal(masked_fill(scores, gt(j, i), -kInf), Shape{3, 3}, {2, -kInf, -kInf, 2, 2, -kInf, 2, 2, 2},
              "causal mask");
  check_equal(where(gt(j, i), scores, full({}, -1.0)), Shape{3, 3}, {-1, 2, 2, -1, -1, 2, -1, -1, -1},
              "where with 0-d operand");
}

TEST_CASE("exactly representable answers are bit exact in every floating dtype", "[elementwise][exact]") {
  for (DType d : testing::kFloatDTypes) {
    const Tensor a = Tensor::from_vector<double>({1, 2, 3, -4, 0.5, 64}).to(d);
    const Tensor b = Tensor::from_vector<double>({4, 8, 16, 2, 0.25, -0.5}).to(d);
    const std::string dn(dtype_name(d));
    check_equal(add(a, b), Shape{6}, {5, 10, 19, -2, 0.75, 63.5}, "add " + dn);
    check_equal(sub(a, b), Shape{6}, {-3, -6, -13, -6, 0.25, 64.5}, "sub " + dn);
    check_equal(mul(a, b), Shape{6}, {4, 16, 48, -8, 0.125, -32}, "mul " + dn);
    check_equal(div(a, b), Shape{6}, {0.25, 0.25, 0.1875, -2, 2, -128}, "div " + dn);
    check_equal(maximum(a, b), Shape{6}, {4, 8, 16, 2, 0.5, 64}, "maximum " + dn);
    check_equal(mul(a, 0.5), Shape{6}, {0.5, 1, 1.5, -2, 0.25, 32}, "mul scalar " + dn);
    check_equal(rsub(a, 1.0), Shape{6}, {0, -1, -2, 5, 0.5, -63}, "rsub " + dn);
    check_equal(pow(a, 2.0), Shape{6}, {1, 4, 9, 16, 0.25, 4096}, "pow 2 " + dn);
    check_equal(neg(a), Shape{6}, {-1, -2, -3, 4, -0.5, -64}, "neg " + dn);
    check_equal(abs(a), Shape{6}, {1, 2, 3, 4, 0.5, 64}, "abs " + dn);
    check_equal(relu(a), Shape{6}, {1, 2, 3, 0, 0.5, 64}, "relu " + dn);
    const Tensor squares = Tensor::from_vector<double>({0, 0.25, 1, 4, 16, 64}).to(d);
    check_equal(sqrt(squares), Shape{6}, {0, 0.5, 1, 2, 4, 8}, "sqrt " + dn);
    check_equal(rsqrt(squares), Shape{6}, {kInf, 2, 1, 0.5, 0.25, 0.125}, "rsqrt " + dn);
    const Tensor zero_one = Tensor::from_vector<double>({0, 1}).to(d);
    check_equal(exp(zeros({2}, d)), Shape{2}, {1, 1}, "exp(0) " + dn);
    check_equal(log(zero_one), Shape{2}, {-kInf, 0}, "log " + dn);
    check_equal(sigmoid(zeros({1}, d)), Shape{1}, {0.5}, "sigmoid(0) " + dn);
    check_equal(tanh(zeros({1}, d)), Shape{1}, {0}, "tanh(0) " + dn);
    check_equal(gelu(zeros({1}, d)), Shape{1}, {0}, "gelu(0) " + dn);
    const Tensor g = full({3}, 2.0, d);
    const Tensor y = Tensor::from_vector<double>({0.5, 0, -0.5}).to(d);
    check_equal(sigmoid_backward(g, y), Shape{3}, {0.5, 0, -1.5}, "sigmoid_backward " + dn);
    check_equal(tanh_backward(g, y), Shape{3}, {1.5, 2, 1.5}, "tanh_backward " + dn);
    check_equal(relu_backward(g, y), Shape{3}, {2, 0, 0}, "relu_backward " + dn);
  }
  const Tensor i = Tensor::from_vector<int32_t>({7, -7, 2147483647});
  check_equal(add(i, Tensor::from_vector<int32_t>({1, 1, 0})), Shape{3}, {8, -6, 2147483647}, "int32 add");
  check_equal(mul(i, -1.0), Shape{3}, {-7, 7, -2147483647}, "int32 mul scalar");
  const Tensor nan_one = Tensor::from_vector<double>({kNaN, 1}).to(kFloat32);
  const Tensor one_nan = Tensor::from_vector<double>({1, kNaN}).to(kFloat32);
  check_equal(maximum(nan_one, one_nan), Shape{2}, {kNaN, kNaN}, "maximum propagates NaN");
  check_equal(minimum(nan_one, one_nan), Shape{2}, {kNaN, kNaN}, "minimum propagates NaN");
  check_equal(relu(Tensor::from_vector<double>({kNaN}).to(kFloat32)), Shape{}, {kNaN}, "relu keeps NaN");
}

TEST_CASE("in-place add_, mul_ and relu_ write through views and leave the rest untouched", "[elementwise][inplace]") {
  for (DType d : kNumericDTypes) {
    Tensor big = full({4, 6}, 10.0, d);
    Tensor window = big.narrow(1, 2, 3);  // columns 2..4, non-contiguous
    Tensor& r = add_(window, Tensor::from_vector<double>({1, 2, 3}).to(d));
    CHECK(&r == &window);
    check_equal(big, Shape{4, 6},
                {10, 10, 11, 12, 13, 10, 10, 10, 11, 12, 13, 10, 10, 10, 11, 12, 13, 10, 10, 10, 11, 12, 13, 10},
                fmt::format("add_ into a narrow, {}", dtype_name(d)));
    Tensor row = big.select(0, 1);
    mul_(row, 2.0);
    check_equal(big.select(0, 1), Shape{6}, {20, 20, 22, 24, 26, 20},
                fmt::format("mul_ into a row, {}", dtype_name(d)));
    check_equal(big.select(0, 0), Shape{6}, {10, 10, 11, 12, 13, 10},
                fmt::format("mul_ leaves row 0, {}", dtype_name(d)));
    Tensor col = big.select(1, 0);
    add_(col, full({}, 1.0, d), -3.0);
    check_equal(big.select(1, 0), Shape{4}, {7, 17, 7, 7}, fmt::format("add_ alpha into a column, {}", dtype_name(d)));
    Tensor shifted = big.select(0, 2);
    add_(shifted, full({}, -11.0, d));
    Tensor& r2 = relu_(shifted);
    CHECK(&r2 == &shifted);
    check_equal(big.select(0, 2), Shape{6}, {0, 0, 0, 1, 2, 0}, fmt::format("relu_ into a row, {}", dtype_name(d)));
    check_equal(big.select(0, 3), Shape{6}, {7, 10, 11, 12, 13, 10},
                fmt::format("relu_ leaves row 3, {}", dtype_name(d)));
  }
  // The swept sizes and layouts: a += alpha * b against the reference.
  for (DType d : testing::kFloatDTypes) {
    for (const BinaryCase& c : binary_inputs(d, Range{}, Range{})) {
      const Shape shape = broadcast_shapes(c.a.shape(), c.b.shape(), "test");
      if (shape != c.a.shape()) continue;  // only b broadcasts in place
      const std::vector<double> a = to_f64(c.a), b = to_f64(c.b.expand(shape));
      std::vector<double> expected;
      for (size_t i = 0; i < a.size(); ++i) expected.push_back(a[i] - 0.5 * b[i]);
      Tensor target = c.a;
      add_(target, c.b, -0.5);
      check_close(c.a, shape, expected, label("add_ alpha -0.5", d, c.layout));
      std::vector<double> scaled;
      for (double v : expected) scaled.push_back(v * 0.9);
      mul_(target, 0.9);
      check_close(c.a, shape, scaled, label("mul_ 0.9", d, c.layout));
    }
  }
}

TEST_CASE("maps large enough to split across threads give the same bits on 1, 2 and 3 threads",
          "[elementwise][parallel]") {
  testing::ThreadCountGuard guard;
  // 301 x 257 = 77357 elements (above the split threshold): a transposed view, a strided
  // view and a broadcast row, so that thread ranges start and end inside runs.
  for (DType dtype : testing::kFloatDTypes) {
    const std::string what = fmt::format("{} [301, 257]", dtype_name(dtype));
    const Tensor a = random_tensor({257, 301}, dtype, 41).t();
    const Tensor b = strided_copy(random_tensor({301, 257}, dtype, 42));
    const Tensor row = random_tensor({257}, dtype, 43);
    auto run_all = [&] {
      return std::vector<Tensor>{add(a, b), mul(a, row), gelu(a, GeluApproximation::kTanh), where(gt(a, 0.0), b, row)};
    };
    set_num_threads(1);
    const std::vector<Tensor> one = run_all();
    // The one-thread results against float64.
    const std::vector<double> av = to_f64(a), bv = to_f64(b), rv = to_f64(row);
    std::vector<double> sum(av.size()), product(av.size()), gelus(av.size()), selected(av.size());
    for (size_t i = 0; i < av.size(); ++i) {
      sum[i] = av[i] + bv[i];
      product[i] = av[i] * rv[i % 257];
      gelus[i] = gelu_tanh_ref(av[i]);
      selected[i] = av[i] > 0 ? bv[i] : rv[i % 257];
    }
    check_close(one[0], Shape{301, 257}, sum, "add " + what);
    check_close(one[1], Shape{301, 257}, product, "mul by a broadcast row " + what);
    check_close(one[2], Shape{301, 257}, gelus, "gelu tanh " + what);
    check_equal(one[3], Shape{301, 257}, selected, "where " + what);
    for (int threads : {2, 3}) {
      set_num_threads(threads);
      const std::vector<Tensor> many = run_all();
      for (size_t k = 0; k < one.size(); ++k) {
        check_equal(many[k], one[k], fmt::format("op {} on {} threads, {}", k, threads, what));
      }
    }
  }
}

TEST_CASE("outputs larger than the caches (streamed) hold every element, in place and at any alignment",
          "[elementwise][parallel]") {
  testing::ThreadCountGuard guard;
  // [2048, 1025] float32 and [2048, 2049] bfloat16 are just above 8 MiB, where map starts
  // streaming its output (kStreamFrom); rows of 1025 floats put row starts off 64-byte lines.
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (DType dtype : {kFloat32, kBFloat16}) {
      const Shape shape = dtype == kFloat32 ? Shape{2049, 1025} : Shape{2049, 2049};
      const std::string what = fmt::format("{}{} on {} threads", dtype_name(dtype), shape, threads);
      const Tensor a = random_tensor(shape, dtype, 51), b = random_tensor(shape, dtype, 52);
      const std::vector<double> av = to_f64(a), bv = to_f64(b);
      std::vector<double> expected(av.size());
      for (size_t i = 0; i < av.size(); ++i) expected[i] = av[i] * bv[i];
      check_close(mul(a, b), shape, expected, "mul " + what);
      // In place on a view that starts one row in: the destination is not line-aligned.
      Tensor c = a.clone();
      Tensor tail = c.narrow(0, 1, shape[0] - 1);
      add_(tail, b.narrow(0, 1, shape[0] - 1));
      for (size_t i = 0; i < av.size(); ++i) {
        const bool first_row = static_cast<int64_t>(i) < shape[1];
        expected[i] = first_row ? av[i] : av[i] + bv[i];
      }
      check_close(c, shape, expected, "add_ into rows 1.. " + what);
    }
  }
}

TEST_CASE("bad operands raise typed errors naming the op, shapes and dtypes", "[elementwise][errors]") {
  const Tensor a = zeros({2, 3}), b16 = zeros({3}, kBFloat16), i32 = zeros({3}, kInt32);
  CHECK_THROWS_AS(add(a, zeros({4})), ValueError);
  CHECK_THROWS_WITH(add(a, zeros({4})), Catch::Contains("add") && Catch::Contains("[2, 3]") &&
                                            Catch::Contains("float32[4]") && Catch::Contains("broadcast"));
  CHECK_THROWS_AS(add(a, b16), TypeError);
  CHECK_THROWS_WITH(add(a, b16),
                    Catch::Contains("add: dtype mismatch: float32[2, 3] and bfloat16[3]; convert one with .to()"));
  CHECK_THROWS_WITH(lt(b16, a), Catch::Contains("lt: dtype mismatch: bfloat16[3] and float32[2, 3]"));
  CHECK_THROWS_AS(div(i32, i32), NotImplementedError);
  CHECK_THROWS_WITH(div(i32, i32), Catch::Contains("div") && Catch::Contains("int32"));
  CHECK_THROWS_WITH(exp(i32), Catch::Contains("exp") && Catch::Contains("int32"));
  CHECK_THROWS_AS(neg(zeros({2}, kBool)), NotImplementedError);
  CHECK_THROWS_AS(add(i32, 0.5), TypeError);
  CHECK_THROWS_WITH(add(i32, 0.5), Catch::Contains("add") && Catch::Contains("0.5") && Catch::Contains("int32[3]"));
  CHECK_THROWS_AS(masked_fill(i32, zeros({3}, kBool), 3e10), TypeError);
  CHECK_THROWS_AS(where(a, a, a), TypeError);
  CHECK_THROWS_WITH(where(a, a, a),
                    Catch::Contains("where") && Catch::Contains("condition") && Catch::Contains("float32[2, 3]"));
  CHECK_THROWS_WITH(where(zeros({2, 1}, kBool), a, zeros({4})),
                    Catch::Contains("where") && Catch::Contains("bool[2, 1]") && Catch::Contains("float32[4]"));
  CHECK_THROWS_AS(masked_fill(a, a, 1.0), TypeError);
  Tensor small = zeros({3});
  CHECK_THROWS_AS(add_(small, a), ValueError);
  CHECK_THROWS_WITH(add_(small, a),
                    Catch::Contains("add_") && Catch::Contains("float32[2, 3]") && Catch::Contains("float32[3]"));
  Tensor expanded = zeros({1, 3}).expand({2, 3});
  CHECK_THROWS_AS(add_(expanded, a), ValueError);
  CHECK_THROWS_WITH(mul_(expanded, 2.0), Catch::Contains("mul_") && Catch::Contains("expanded"));
  Tensor row = zeros({4});
  CHECK_THROWS_WITH(add_(row, row.narrow(0, 1, 1)), Catch::Contains("add_") && Catch::Contains("overlapping"));
  Tensor buffer = arange(8, kFloat32), low = buffer.narrow(0, 0, 4);
  add_(low, buffer.narrow(0, 4, 4));  // disjoint views of one buffer are fine
  check_equal(buffer, Shape{8}, {4, 6, 8, 10, 4, 5, 6, 7}, "add_ between disjoint views of one storage");
  add_(low, low);
  check_equal(low, Shape{4}, {8, 12, 16, 20}, "add_ of a tensor to itself");
  CHECK_THROWS_AS(clamp(a, std::nullopt, std::nullopt), ValueError);
  CHECK_THROWS_AS(add(Tensor(), a), ValueError);
}

}  // namespace
}  // namespace dtr
