// Elementwise ops on local tensors: arithmetic, activations and their fused backward
// kernels, comparisons and selection (PyTorch's names and semantics).
//
// Binary ops broadcast like numpy and require equal dtypes: there is no implicit type
// promotion, so float32 + bfloat16 is a TypeError that says to convert one with .to().
// Operands share a device. Results are new contiguous tensors; the in-place ops (add_,
// mul_) write through any non-expanded view. bfloat16/float16 compute in float and round
// once on store. Scalars are doubles; on integer tensors they must be integers in range.
// Comparisons return bool tensors. Each op dispatches on device in one switch: CPU
// kernels in cpu/elementwise.h, CUDA ones in cuda/elementwise.h (one map kernel, vectorised
// where the operands are contiguous, at most 8 dims).
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace dtr {

// How gelu is computed: the exact erf form, or the tanh approximation (torch's
// approximate="none" / "tanh").
enum class GeluApproximation : uint8_t { kNone, kTanh };

// --- binary, tensor-tensor (broadcasting, equal dtypes) ---
Tensor add(const Tensor& a, const Tensor& b);  // numeric dtypes
Tensor sub(const Tensor& a, const Tensor& b);  // numeric dtypes
Tensor mul(const Tensor& a, const Tensor& b);  // numeric dtypes
Tensor div(const Tensor& a, const Tensor& b);  // floating dtypes (true division)
// Elementwise max/min; a NaN in either operand gives NaN (torch.maximum/minimum).
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

// --- binary, tensor-scalar: the scalar is applied in the compute type (float for bf16) ---
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
// b - a (torch.rsub), e.g. 1 - p.
Tensor rsub(const Tensor& a, double b);
// a ** exponent, floating dtypes.
Tensor pow(const Tensor& a, double exponent);

// --- in place: a is overwritten and returned; b broadcasts to a's shape and may be a
// itself, but not another view overlapping it ---
// a += alpha * b (torch's add_(b, alpha=...)): gradient accumulation, SGD steps.
Tensor& add_(Tensor& a, const Tensor& b, double alpha = 1.0);
// a *= b (weight decay, gradient scaling).
Tensor& mul_(Tensor& a, double b);
// a = relu(a), numeric dtypes (torch's relu_).
Tensor& relu_(Tensor& a);

// --- unary ---
Tensor neg(const Tensor& x);   // numeric dtypes
Tensor abs(const Tensor& x);   // numeric dtypes
Tensor relu(const Tensor& x);  // numeric dtypes; max(x, 0), NaN stays NaN
Tensor exp(const Tensor& x);   // the rest: floating dtypes
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
// x * Phi(x): exact with erf, or 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor gelu(const Tensor& x, GeluApproximation approximate = GeluApproximation::kNone);
Tensor silu(const Tensor& x);  // x * sigmoid(x)
// min(max(x, min), max) with either bound optional (not both); NaN stays NaN. Numeric dtypes.
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);

// --- fused backward kernels: grad_input from grad_output and the saved tensor ---
Tensor relu_backward(const Tensor& grad, const Tensor& x);  // grad * (x > 0)
Tensor gelu_backward(const Tensor& grad, const Tensor& x, GeluApproximation approximate = GeluApproximation::kNone);
Tensor silu_backward(const Tensor& grad, const Tensor& x);     // grad * s (1 + x (1 - s)), s = sigmoid(x)
Tensor sigmoid_backward(const Tensor& grad, const Tensor& y);  // grad * (1 - y) * y, y = sigmoid(x)
Tensor tanh_backward(const Tensor& grad, const Tensor& y);     // grad * (1 - y^2), y = tanh(x)

// --- comparisons: bool tensors. With a scalar, it is first rounded to a's dtype (as torch does) ---
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);

// --- logical and selection ---
// x == 0, as bool, for any dtype.
Tensor logical_not(const Tensor& x);
// condition ? a : b, all three broadcast; condition is bool, a and b share a dtype.
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
// mask ? value : x, mask (bool) and x broadcast (e.g. a causal mask on attention scores).
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

}  // namespace dtr
