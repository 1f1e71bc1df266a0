// CPU elementwise kernels: the CPU half of kernels/elementwise.h.
//
// Each kernel writes out[i] = f(inputs[i]...) over out's shape, its inputs broadcasting
// to it. The Tensor-level op has already checked devices, dtypes, shapes and scalars and
// allocated out; the kernel dispatches on dtype (the one place it does) and throws
// NotImplementedError for a dtype the op does not support. out may be one of the inputs
// (in-place ops) but must not partially overlap any. bfloat16/float16 load to float,
// compute, and round once on store. The kernels live in cpu/arithmetic.cc, cpu/activation.cc
// and cpu/compare.cc over cpu/internal/elementwise_loop.h. (ATen's per-op CPU kernels.)
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/tensor.h"
#include "kernels/elementwise.h"

namespace dtr::cpu {

// out = a + alpha * b.
void add(const Tensor& out, const Tensor& a, const Tensor& b, double alpha);
void sub(const Tensor& out, const Tensor& a, const Tensor& b);
void mul(const Tensor& out, const Tensor& a, const Tensor& b);
void div(const Tensor& out, const Tensor& a, const Tensor& b);
void maximum(const Tensor& out, const Tensor& a, const Tensor& b);
void minimum(const Tensor& out, const Tensor& a, const Tensor& b);

// Tensor-scalar forms: out = a + s, a - s, a * s, a / s, s - a, a ** s.
void add_scalar(const Tensor& out, const Tensor& a, double s);
void sub_scalar(const Tensor& out, const Tensor& a, double s);
void mul_scalar(const Tensor& out, const Tensor& a, double s);
void div_scalar(const Tensor& out, const Tensor& a, double s);
void rsub_scalar(const Tensor& out, const Tensor& a, double s);
void pow_scalar(const Tensor& out, const Tensor& a, double exponent);

void neg(const Tensor& out, const Tensor& x);
void abs(const Tensor& out, const Tensor& x);
void relu(const Tensor& out, const Tensor& x);
void exp(const Tensor& out, const Tensor& x);
void log(const Tensor& out, const Tensor& x);
void sqrt(const Tensor& out, const Tensor& x);
void rsqrt(const Tensor& out, const Tensor& x);
void tanh(const Tensor& out, const Tensor& x);
void sigmoid(const Tensor& out, const Tensor& x);
void gelu(const Tensor& out, const Tensor& x, GeluApproximation approximate);
void silu(const Tensor& out, const Tensor& x);
// An absent bound does not clamp.
void clamp(const Tensor& out, const Tensor& x, std::optional<double> min, std::optional<double> max);

void relu_backward(const Tensor& out, const Tensor& grad, const Tensor& x);
void gelu_backward(const Tensor& out, const Tensor& grad, const Tensor& x, GeluApproximation approximate);
void silu_backward(const Tensor& out, const Tensor& grad, const Tensor& x);
void sigmoid_backward(const Tensor& out, const Tensor& grad, const Tensor& y);
void tanh_backward(const Tensor& out, const Tensor& grad, const Tensor& y);

enum class CompareOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe };
// "eq", "ne", ...: the op's name in messages.
std::string_view compare_op_name(CompareOp op);
// out (bool) = a op b, every dtype.
void compare(const Tensor& out, const Tensor& a, const Tensor& b, CompareOp op);
// out (bool) = a op s, with s rounded to a's dtype first.
void compare_scalar(const Tensor& out, const Tensor& a, double s, CompareOp op);

void logical_not(const Tensor& out, const Tensor& x);
void where(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b);
void masked_fill(const Tensor& out, const Tensor& x, const Tensor& mask, double value);

}  // namespace dtr::cpu
