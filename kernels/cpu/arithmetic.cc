// CPU kernels of kernels/cpu/elementwise.h: arithmetic (tensor-tensor and tensor-scalar),
// neg, abs and clamp.
#include <cmath>
#include <limits>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/internal/elementwise_loop.h"
#include "kernels/cpu/internal/vec_math.h"

namespace dtr::cpu {

void add(const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
  dispatch_numeric(a.dtype(), "add", [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(alpha);
    map<T, T, T>(
        out, [k](auto x, auto y) { return x + k * y; }, a, b);
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
  numeric_scalar("add", out, a, s, [](auto x, auto k) { return x + k; });
}

void sub_scalar(const Tensor& out, const Tensor& a, double s) {
  numeric_scalar("sub", out, a, s, [](auto x, auto k) { return x - k; });
}

void mul_scalar(const Tensor& out, const Tensor& a, double s) {
  numeric_scalar("mul", out, a, s, [](auto x, auto k) { return x * k; });
}

void div_scalar(const Tensor& out, const Tensor& a, double s) {
  floating_scalar("div", out, a, s, [](auto x, auto k) { return x / k; });
}

void rsub_scalar(const Tensor& out, const Tensor& a, double s) {
  numeric_scalar("rsub", out, a, s, [](auto x, auto k) { return k - x; });
}

void pow_scalar(const Tensor& out, const Tensor& a, double exponent) {
  dispatch_floating(a.dtype(), "pow", [&]<class T>(TypeTag<T>) {
    if (exponent == 2.0) {  // the common square, kept vectorisable
      map<T, T>(
          out, [](auto x) { return x * x; }, a);
      return;
    }
    const auto e = static_cast<opmath_t<T>>(exponent);
    map<T, T>(
        out, [e](auto x) { return std::pow(x, e); }, a);
  });
}

void neg(const Tensor& out, const Tensor& x) {
  numeric_unary("neg", out, x, [](auto v) { return -v; });
}

void abs(const Tensor& out, const Tensor& x) {
  numeric_unary("abs", out, x, [](auto v) { return v < decltype(v)(0) ? -v : v; });
}

void clamp(const Tensor& out, const Tensor& x, std::optional<double> min, std::optional<double> max) {
  dispatch_numeric(x.dtype(), "clamp", [&]<class T>(TypeTag<T>) {
    using M = opmath_t<T>;
    using Limits = std::numeric_limits<M>;
    const M lo = min ? static_cast<M>(*min) : Limits::has_infinity ? -Limits::infinity() : Limits::lowest();
    const M hi = max ? static_cast<M>(*max) : Limits::has_infinity ? Limits::infinity() : Limits::max();
    // min(max(v, lo), hi), so lo > hi gives hi as in torch; NaN compares false and passes.
    map<T, T>(
        out,
        [lo, hi](M v) {
          const M r = v < lo ? lo : v;
          return r > hi ? hi : r;
        },
        x);
  });
}

}  // namespace dtr::cpu
