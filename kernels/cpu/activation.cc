// CPU kernels of kernels/cpu/elementwise.h: exp, log, sqrt, rsqrt, tanh and the
// activations (relu, sigmoid, gelu, silu) with their fused backward kernels.
#include <cmath>
#include <numbers>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/internal/elementwise_loop.h"
#include "kernels/cpu/internal/vec_math.h"

namespace dtr::cpu {
namespace {

// 1 / (1 + exp(-x)) as (x >= 0 ? 1 : e) / (1 + e) with e = exp(-|x|) <= 1: the exp never
// overflows (so it is the cheaper exp_nonpositive_of) and neither tail cancels.
template <class M>
M sigmoid_of(M x) {
  const M e = exp_nonpositive_of(-std::abs(x));
  return (x >= M(0) ? M(1) : e) / (M(1) + e);
}

// gelu's constants: 1/sqrt(2), sqrt(2/pi), 1/sqrt(2 pi), and the cubic coefficient.
constexpr double kSqrtHalf = std::numbers::sqrt2 / 2;
constexpr double kSqrt2OverPi = std::numbers::sqrt2 * std::numbers::inv_sqrtpi;
constexpr double kInvSqrt2Pi = kSqrtHalf * std::numbers::inv_sqrtpi;
constexpr double kGeluCubic = 0.044715;

}  // namespace

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
    const M pdf = M(kInvSqrt2Pi) * exp_nonpositive_of(M(-0.5) * v * v);
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
  floating_binary("sigmoid_backward", out, grad, y, [](auto g, auto v) { return g * (decltype(v)(1) - v) * v; });
}

void tanh_backward(const Tensor& out, const Tensor& grad, const Tensor& y) {
  floating_binary("tanh_backward", out, grad, y, [](auto g, auto v) { return g * (decltype(v)(1) - v * v); });
}

}  // namespace dtr::cpu
