#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/cpu/internal/vec_math.h"
#include "kernels/cpu/internal/strided_loop.h"

namespace dtr::cpu {
namespace {

// The type an element is computed in: float for the 16-bit floats, the type itself otherwise.
template <class T>
using opmath_t = std::conditional_t<std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>, float, T>;

// One run of map: contiguous (every stride equal to its itemsize) or strided.
template <class Out, class... In, class F, size_t... K>
void map_run(std::array<char*, 1 + sizeof...(In)> p, std::array<int64_t, 1 + sizeof...(In)> s, int64_t n,
             const F& f, std::index_sequence<K...>) {
  if (s[0] == sizeof(Out) && ((s[K + 1] == sizeof(In)) && ...)) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const std::tuple<const In*...> in{reinterpret_cast<const In*>(p[K + 1])...};
    // out is either disjoint from every input or equal to one: no loop-carried dependence.
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(f(static_cast<opmath_t<In>>(std::get<K>(in)[i])...));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    *reinterpret_cast<Out*>(p[0] + i * s[0]) =
        convert<Out>(f(static_cast<opmath_t<In>>(*reinterpret_cast<const In*>(p[K + 1] + i * s[K + 1]))...));
  }
}

template <class>
using TensorRef = const Tensor&;

// out[i] = f(in[i]...) over out's shape, each input (element type In) broadcast to it and
// loaded as opmath_t<In>; the result is stored as Out.
template <class Out, class... In, class F>
void map(const Tensor& out, const F& f, TensorRef<In>... in) {
  constexpr size_t N = 1 + sizeof...(In);
  const std::array<char*, N> base{static_cast<char*>(out.data()), static_cast<char*>(in.data())...};
  const std::array<std::vector<int64_t>, N> strides{broadcast_byte_strides(out, out.shape()),
                                                    broadcast_byte_strides(in, out.shape())...};
  for_each_run<N>(out.shape(), base, strides, [&f](std::array<char*, N> p, std::array<int64_t, N> s, int64_t n) {
    map_run<Out, In...>(p, s, n, f, std::index_sequence_for<In...>());
  });
}

// Same-dtype unary and binary maps over the floating or the numeric dtypes.
template <class F>
void floating_unary(std::string_view op, const Tensor& out, const Tensor& x, const F& f) {
  dispatch_floating(x.dtype(), op, [&]<class T>(TypeTag<T>) { map<T, T>(out, f, x); });
}
template <class F>
void numeric_unary(std::string_view op, const Tensor& out, const Tensor& x, const F& f) {
  dispatch_numeric(x.dtype(), op, [&]<class T>(TypeTag<T>) { map<T, T>(out, f, x); });
}
template <class F>
void floating_binary(std::string_view op, const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  dispatch_floating(a.dtype(), op, [&]<class T>(TypeTag<T>) { map<T, T, T>(out, f, a, b); });
}
template <class F>
void numeric_binary(std::string_view op, const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  dispatch_numeric(a.dtype(), op, [&]<class T>(TypeTag<T>) { map<T, T, T>(out, f, a, b); });
}

// exp in the compute type: the vectorisable fast_exp for float, std::exp for double.
template <class M>
M exp_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return fast_exp(x);
  } else {
    return std::exp(x);
  }
}

template <class M>
M sigmoid_of(M x) {
  return M(1) / (M(1) + exp_of(-x));
}

// gelu's constants: 1/sqrt(2), sqrt(2/pi), 1/sqrt(2 pi), and the cubic coefficient.
constexpr double kSqrtHalf = std::numbers::sqrt2 / 2;
constexpr double kSqrt2OverPi = std::numbers::sqrt2 * std::numbers::inv_sqrtpi;
constexpr double kInvSqrt2Pi = kSqrtHalf * std::numbers::inv_sqrtpi;
constexpr double kGeluCubic = 0.044715;

}  // namespace

void add(const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
  dispatch_numeric(a.dtype(), "add", [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(alpha);
    map<T, T, T>(out, [k](auto x, auto y) { return x + k * y; }, a, b);
  });
}

void sub(const Tensor& out, const Tensor& a, const Tensor& b) {
  numeric_binary("sub", out, a, b, [](auto x, auto y) { return x - y; });
}

void mul(const Tensor& out, const Tensor& a, const Tensor& b) {
  numeric_binary("mul", out, a, b, [](auto x, auto y) { return x * y; });
}

void div(const Tensor& out, const Tensor& a, const Tensor& b) {
  floating_binary("div", out, a, b, [](auto x, auto y) { return x / y; });
}

void maximum(const Tensor& out, const Tensor& a, const Tensor& b) {
  numeric_binary("maximum", out, a, b, [](auto x, auto y) { return is_nan(x) || x > y ? x : y; });
}

void minimum(const Tensor& out, const Tensor& a, const Tensor& b) {
  numeric_binary("minimum", out, a, b, [](auto x, auto y) { return is_nan(x) || x < y ? x : y; });
}

void add_scalar(const Tensor& out, const Tensor& a, double s) {
  dispatch_numeric(a.dtype(), "add", [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(s);
    map<T, T>(out, [k](auto x) { return x + k; }, a);
  });
}

void sub_scalar(const Tensor& out, const Tensor& a, double s) {
  dispatch_numeric(a.dtype(), "sub", [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(s);
    map<T, T>(out, [k](auto x) { return x - k; }, a);
  });
}

void mul_scalar(const Tensor& out, const Tensor& a, double s) {
  dispatch_numeric(a.dtype(), "mul", [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(s);
    map<T, T>(out, [k](auto x) { return x * k; }, a);
  });
}

void div_scalar(const Tensor& out, const Tensor& a, double s) {
  dispatch_floating(a.dtype(), "div", [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(s);
    map<T, T>(out, [k](auto x) { return x / k; }, a);
  });
}

void rsub_scalar(const Tensor& out, const Tensor& a, double s) {
  dispatch_numeric(a.dtype(), "rsub", [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(s);
    map<T, T>(out, [k](auto x) { return k - x; }, a);
  });
}

void pow_scalar(const Tensor& out, const Tensor& a, double exponent) {
  dispatch_floating(a.dtype(), "pow", [&]<class T>(TypeTag<T>) {
    if (exponent == 2.0) {  // the common square, kept vectorisable
      map<T, T>(out, [](auto x) { return x * x; }, a);
      return;
    }
    const auto e = static_cast<opmath_t<T>>(exponent);
    map<T, T>(out, [e](auto x) { return std::pow(x, e); }, a);
  });
}

void neg(const Tensor& out, const Tensor& x) {
  numeric_unary("neg", out, x, [](auto v) { return -v; });
}

void abs(const Tensor& out, const Tensor& x) {
  numeric_unary("abs", out, x, [](auto v) { return v < decltype(v)(0) ? -v : v; });
}

void relu(const Tensor& out, const Tensor& x) {
  numeric_unary("relu", out, x, [](auto v) { return v < decltype(v)(0) ? decltype(v)(0) : v; });
}

void exp(const Tensor& out, const Tensor& x) {
  floating_unary("exp", out, x, [](auto v) { return exp_of(v); });
}

void log(const Tensor& out, const Tensor& x) {
  floating_unary("log", out, x, [](auto v) { return std::log(v); });
}

void sqrt(const Tensor& out, const Tensor& x) {
  floating_unary("sqrt", out, x, [](auto v) { return std::sqrt(v); });
}

void rsqrt(const Tensor& out, const Tensor& x) {
  floating_unary("rsqrt", out, x, [](auto v) { return decltype(v)(1) / std::sqrt(v); });
}

void tanh(const Tensor& out, const Tensor& x) {
  floating_unary("tanh", out, x, [](auto v) { return std::tanh(v); });
}

void sigmoid(const Tensor& out, const Tensor& x) {
  floating_unary("sigmoid", out, x, [](auto v) { return sigmoid_of(v); });
}

void gelu(const Tensor& out, const Tensor& x, GeluApproximation approximate) {
  if (approximate == GeluApproximation::kTanh) {
    // 0.5 v (1 + tanh(u)) = v * sigmoid(2u): the same value without tanh's call, and
    // without cancellation where tanh(u) is near -1.
    floating_unary("gelu", out, x, [](auto v) {
      using M = decltype(v);
      return v * sigmoid_of(M(2 * kSqrt2OverPi) * (v + M(kGeluCubic) * v * v * v));
    });
    return;
  }
  floating_unary("gelu", out, x, [](auto v) {
    using M = decltype(v);
    return M(0.5) * v * (M(1) + std::erf(v * M(kSqrtHalf)));
  });
}

void silu(const Tensor& out, const Tensor& x) {
  floating_unary("silu", out, x, [](auto v) { return v * sigmoid_of(v); });
}

void clamp(const Tensor& out, const Tensor& x, std::optional<double> min, std::optional<double> max) {
  dispatch_numeric(x.dtype(), "clamp", [&]<class T>(TypeTag<T>) {
    using M = opmath_t<T>;
    using Limits = std::numeric_limits<M>;
    const M lo = min ? static_cast<M>(*min) : Limits::has_infinity ? -Limits::infinity() : Limits::lowest();
    const M hi = max ? static_cast<M>(*max) : Limits::has_infinity ? Limits::infinity() : Limits::max();
    // min(max(v, lo), hi), so lo > hi gives hi as in torch; NaN compares false and passes.
    map<T, T>(out, [lo, hi](M v) {
      const M r = v < lo ? lo : v;
      return r > hi ? hi : r;
    }, x);
  });
}

void relu_backward(const Tensor& out, const Tensor& grad, const Tensor& x) {
  floating_binary("relu_backward", out, grad, x,
                  [](auto g, auto v) { return v <= decltype(v)(0) ? decltype(v)(0) : g; });
}

void gelu_backward(const Tensor& out, const Tensor& grad, const Tensor& x, GeluApproximation approximate) {
  if (approximate == GeluApproximation::kTanh) {
    floating_binary("gelu_backward", out, grad, x, [](auto g, auto v) {
      using M = decltype(v);
      // gelu = 0.5 v (1 + tanh(u)) = v s with s = sigmoid(2u), u = sqrt(2/pi) (v + c v^3);
      // d/dv = s + v * 2 s (1 - s) * du/dv.
      const M s = sigmoid_of(M(2 * kSqrt2OverPi) * (v + M(kGeluCubic) * v * v * v));
      const M du = M(kSqrt2OverPi) * (M(1) + M(3 * kGeluCubic) * v * v);
      return g * (s + M(2) * v * s * (M(1) - s) * du);
    });
    return;
  }
  floating_binary("gelu_backward", out, grad, x, [](auto g, auto v) {
    using M = decltype(v);
    const M cdf = M(0.5) * (M(1) + std::erf(v * M(kSqrtHalf)));
    const M pdf = M(kInvSqrt2Pi) * exp_of(M(-0.5) * v * v);
    return g * (cdf + v * pdf);
  });
}

void silu_backward(const Tensor& out, const Tensor& grad, const Tensor& x) {
  floating_binary("silu_backward", out, grad, x, [](auto g, auto v) {
    using M = decltype(v);
    const M s = sigmoid_of(v);
    return g * s * (M(1) + v * (M(1) - s));
  });
}

void sigmoid_backward(const Tensor& out, const Tensor& grad, const Tensor& y) {
  floating_binary("sigmoid_backward", out, grad, y,
                  [](auto g, auto v) { return g * (decltype(v)(1) - v) * v; });
}

void tanh_backward(const Tensor& out, const Tensor& grad, const Tensor& y) {
  floating_binary("tanh_backward", out, grad, y, [](auto g, auto v) { return g * (decltype(v)(1) - v * v); });
}

std::string_view compare_op_name(CompareOp op) {
  switch (op) {
    case CompareOp::kEq: return "eq";
    case CompareOp::kNe: return "ne";
    case CompareOp::kLt: return "lt";
    case CompareOp::kLe: return "le";
    case CompareOp::kGt: return "gt";
    case CompareOp::kGe: return "ge";
  }
  DTR_INTERNAL_ASSERT(false, "unknown CompareOp {}", static_cast<int>(op));
}

namespace {

// Calls f with the std:: function object of a comparison.
template <class F>
void with_comparison(CompareOp op, const F& f) {
  switch (op) {
    case CompareOp::kEq: return f(std::equal_to<>());
    case CompareOp::kNe: return f(std::not_equal_to<>());
    case CompareOp::kLt: return f(std::less<>());
    case CompareOp::kLe: return f(std::less_equal<>());
    case CompareOp::kGt: return f(std::greater<>());
    case CompareOp::kGe: return f(std::greater_equal<>());
  }
  DTR_INTERNAL_ASSERT(false, "unknown CompareOp {}", static_cast<int>(op));
}

}  // namespace

void compare(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch_all(a.dtype(), compare_op_name(op), [&]<class T>(TypeTag<T>) {
    with_comparison(op, [&](auto cmp) { map<bool, T, T>(out, cmp, a, b); });
  });
}

void compare_scalar(CompareOp op, const Tensor& out, const Tensor& a, double s) {
  dispatch_all(a.dtype(), compare_op_name(op), [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(convert<T>(s));
    with_comparison(op, [&](auto cmp) { map<bool, T>(out, [k, cmp](auto x) { return cmp(x, k); }, a); });
  });
}

void logical_not(const Tensor& out, const Tensor& x) {
  dispatch_all(x.dtype(), "logical_not", [&]<class T>(TypeTag<T>) {
    map<bool, T>(out, [](auto v) { return v == decltype(v)(0); }, x);
  });
}

void where(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b) {
  dispatch_all(a.dtype(), "where", [&]<class T>(TypeTag<T>) {
    map<T, bool, T, T>(out, [](bool c, auto x, auto y) { return c ? x : y; }, condition, a, b);
  });
}

void masked_fill(const Tensor& out, const Tensor& x, const Tensor& mask, double value) {
  dispatch_all(x.dtype(), "masked_fill", [&]<class T>(TypeTag<T>) {
    const auto v = static_cast<opmath_t<T>>(value);
    map<T, T, bool>(out, [v](auto e, bool m) { return m ? v : e; }, x, mask);
  });
}

}  // namespace dtr::cpu
