#include "kernels/elementwise.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "core/check_writable.h"
#include "core/cuda/stream.h"
#include "core/cuda_map_layout.h"
#include "core/trace.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"

namespace dtr {
namespace {

using internal::check_writable;

void check_defined(std::string_view op, const Tensor& t) {
  DTR_CHECK(t.defined(), ValueError, "{}: an operand is an undefined tensor", op);
}

// Both defined, on one device, of one dtype (there is no implicit promotion).
void check_operands(std::string_view op, const Tensor& a, const Tensor& b) {
  check_defined(op, a);
  check_defined(op, b);
  DTR_CHECK(a.device() == b.device(), ValueError, "{}: operands on different devices: {} and {}; move one with .to()",
            op, describe(a), describe(b));
  DTR_CHECK(a.dtype() == b.dtype(), TypeError, "{}: dtype mismatch: {} and {}; convert one with .to()", op, describe(a),
            describe(b));
}

// A bool operand (a condition or a mask) on the device of t.
void check_bool_operand(std::string_view op, std::string_view role, const Tensor& b, const Tensor& t) {
  check_defined(op, b);
  DTR_CHECK(b.dtype() == kBool, TypeError,
            "{}: the {} must be a bool tensor, got {}; build it with a comparison such "
            "as gt() or convert it with .to(kBool)",
            op, role, describe(b));
  DTR_CHECK(b.device() == t.device(), ValueError, "{}: the {} {} and the operand {} are on different devices", op, role,
            describe(b), describe(t));
}

// "float32[2, 3], bool[3]": the operands of an op, for its error messages.
std::string describe_operands(std::initializer_list<const Tensor*> operands) {
  std::vector<std::string> names;
  for (const Tensor* t : operands) names.push_back(describe(*t));
  return fmt::format("{}", fmt::join(names, ", "));
}

// The broadcast shape of the operands; the error names every operand with its dtype.
Shape broadcast_operands(std::string_view op, std::initializer_list<const Tensor*> operands) {
  Shape shape;
  try {
    for (const Tensor* t : operands) shape = broadcast_shapes(shape, t->shape(), op);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{} (operands {})", e.what(), describe_operands(operands)));
  }
  return shape;
}

// The device switch of every elementwise op: cpu_kernel(out) for CPU tensors,
// cuda_kernel(out) for CUDA ones.
template <class CpuKernel, class CudaKernel>
void dispatch_device(std::string_view op, const Tensor& out, const CpuKernel& cpu_kernel,
                     const CudaKernel& cuda_kernel) {
  const trace::Span span(op, trace::Category::kKernel);
  switch (out.device().type) {
    case kCPU: cpu_kernel(out); return;
    case kCUDA: cuda_kernel(out); return;
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

// cuda::map of `op` writing out from `inputs`, each broadcast to out's shape; `dtype` is the
// value operands'.
void cuda_map(std::string_view name, const Tensor& out, std::initializer_list<const Tensor*> inputs, DType dtype,
              cuda::MapOp op, cuda::MapScalars scalars = {}) {
  const cuda::MapShape shape = internal::map_shape(name, out.shape());
  std::vector<cuda::MapOperand> in;
  for (const Tensor* t : inputs) in.push_back(internal::map_operand(*t, out.shape()));
  const int device = out.device().index;
  cuda::map(internal::map_operand(out, out.shape()), in.data(), shape, dtype, op, scalars, device,
            cuda::current_stream(device).handle());
}

// What a comparison's right-hand side is: a tensor, or a scalar.
enum class CompareWith : uint8_t { kTensor, kScalar };

cuda::MapOp cuda_compare_op(cpu::CompareOp cmp, CompareWith rhs) {
  const bool scalar = rhs == CompareWith::kScalar;
  switch (cmp) {
    case cpu::CompareOp::kEq: return scalar ? cuda::MapOp::kEqScalar : cuda::MapOp::kEq;
    case cpu::CompareOp::kNe: return scalar ? cuda::MapOp::kNeScalar : cuda::MapOp::kNe;
    case cpu::CompareOp::kLt: return scalar ? cuda::MapOp::kLtScalar : cuda::MapOp::kLt;
    case cpu::CompareOp::kLe: return scalar ? cuda::MapOp::kLeScalar : cuda::MapOp::kLe;
    case cpu::CompareOp::kGt: return scalar ? cuda::MapOp::kGtScalar : cuda::MapOp::kGt;
    case cpu::CompareOp::kGe: return scalar ? cuda::MapOp::kGeScalar : cuda::MapOp::kGe;
  }
  DTR_INTERNAL_ASSERT(false, "unknown CompareOp {}", static_cast<int>(cmp));
}

// Integer and bool tensors take only scalars their dtype holds exactly: 0.5 on an int32
// tensor would need promotion to float, which dtr never does implicitly.
void check_scalar(std::string_view op, const Tensor& t, double s) {
  double lo = 0, end = 0;  // the dtype's integers are [lo, end)
  switch (t.dtype()) {
    case kInt32: lo = -2147483648.0, end = 2147483648.0; break;
    case kInt64: lo = -9223372036854775808.0, end = 9223372036854775808.0; break;
    case kBool: lo = 0, end = 2; break;
    default: return;  // floating: any double converts (and may round)
  }
  DTR_CHECK(s == std::trunc(s) && s >= lo && s < end, TypeError,
            "{}: scalar {} does not fit {} (an integer in [{}, {}) is needed); convert the tensor with .to(kFloat32) "
            "for fractional values",
            op, s, describe(t), lo, end);
}

// An in-place op reads b while it writes a: b may be a itself, or memory apart from it,
// but not another view into a's elements (the result would depend on the loop order).
void check_no_partial_overlap(std::string_view op, const Tensor& a, const Tensor& b) {
  if (!a.storage().is_same(b.storage()) || a.numel() == 0 || b.numel() == 0) return;
  auto extent = [](const Tensor& t) {  // one past the last element t can address
    int64_t end = t.offset() + 1;
    for (int64_t d = 0; d < t.dim(); ++d) end += (t.size(d) - 1) * t.stride(d);
    return end;
  };
  const bool same = a.offset() == b.offset() && a.shape() == b.shape() && a.strides() == b.strides();
  DTR_CHECK(same || extent(a) <= b.offset() || extent(b) <= a.offset(), ValueError,
            "{}: {} is a view overlapping the destination {} in memory; clone() it first", op, describe(b),
            describe(a));
}

// out = f(x) with out shaped like x: cpu_kernel(out) on the CPU, cuda_op on CUDA.
template <class CpuKernel>
Tensor unary(std::string_view op, const Tensor& x, DType out_dtype, const CpuKernel& cpu_kernel, cuda::MapOp cuda_op,
             cuda::MapScalars scalars = {}) {
  check_defined(op, x);
  Tensor out = Tensor::empty(x.shape(), out_dtype, x.device());
  dispatch_device(op, out, cpu_kernel, [&](const Tensor& o) { cuda_map(op, o, {&x}, x.dtype(), cuda_op, scalars); });
  return out;
}

Tensor unary(std::string_view op, const Tensor& x, void (*kernel)(const Tensor&, const Tensor&), cuda::MapOp cuda_op) {
  return unary(
      op, x, x.dtype(), [&](const Tensor& out) { kernel(out, x); }, cuda_op);
}

// out = kernel(a, s), s checked against a's dtype.
Tensor scalar_op(std::string_view op, const Tensor& a, double s, void (*kernel)(const Tensor&, const Tensor&, double),
                 cuda::MapOp cuda_op) {
  check_defined(op, a);
  check_scalar(op, a, s);
  return unary(op, a, a.dtype(), [&](const Tensor& out) { kernel(out, a, s); }, cuda_op, {.s0 = s, .s1 = 0});
}

// out = f(a, b) over the broadcast shape of a and b.
template <class CpuKernel>
Tensor binary(std::string_view op, const Tensor& a, const Tensor& b, DType out_dtype, const CpuKernel& cpu_kernel,
              cuda::MapOp cuda_op, cuda::MapScalars scalars = {}) {
  check_operands(op, a, b);
  Tensor out = Tensor::empty(broadcast_operands(op, {&a, &b}), out_dtype, a.device());
  dispatch_device(op, out, cpu_kernel, [&](const Tensor& o) {
    cuda_map(op, o, {&a, &b}, a.dtype(), cuda_op, scalars);
  });
  return out;
}

Tensor binary(std::string_view op, const Tensor& a, const Tensor& b,
              void (*kernel)(const Tensor&, const Tensor&, const Tensor&), cuda::MapOp cuda_op) {
  return binary(
      op, a, b, a.dtype(), [&](const Tensor& out) { kernel(out, a, b); }, cuda_op);
}

Tensor comparison(cpu::CompareOp cmp, const Tensor& a, const Tensor& b) {
  return binary(
      cpu::compare_op_name(cmp), a, b, kBool, [&](const Tensor& out) { cpu::compare(out, a, b, cmp); },
      cuda_compare_op(cmp, CompareWith::kTensor));
}

Tensor comparison(cpu::CompareOp cmp, const Tensor& a, double s) {
  const std::string_view op = cpu::compare_op_name(cmp);
  check_defined(op, a);
  check_scalar(op, a, s);
  return unary(op, a, kBool, [&](const Tensor& out) { cpu::compare_scalar(out, a, s, cmp); },
               cuda_compare_op(cmp, CompareWith::kScalar), {.s0 = s, .s1 = 0});
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return binary("add", a, b, a.dtype(), [&](const Tensor& out) { cpu::add(out, a, b, 1.0); }, cuda::MapOp::kAdd,
                {.s0 = 1.0, .s1 = 0});
}
Tensor sub(const Tensor& a, const Tensor& b) { return binary("sub", a, b, cpu::sub, cuda::MapOp::kSub); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary("mul", a, b, cpu::mul, cuda::MapOp::kMul); }
Tensor div(const Tensor& a, const Tensor& b) { return binary("div", a, b, cpu::div, cuda::MapOp::kDiv); }
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary("maximum", a, b, cpu::maximum, cuda::MapOp::kMaximum);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary("minimum", a, b, cpu::minimum, cuda::MapOp::kMinimum);
}

Tensor add(const Tensor& a, double b) { return scalar_op("add", a, b, cpu::add_scalar, cuda::MapOp::kAddScalar); }
Tensor sub(const Tensor& a, double b) { return scalar_op("sub", a, b, cpu::sub_scalar, cuda::MapOp::kSubScalar); }
Tensor mul(const Tensor& a, double b) { return scalar_op("mul", a, b, cpu::mul_scalar, cuda::MapOp::kMulScalar); }
Tensor div(const Tensor& a, double b) { return scalar_op("div", a, b, cpu::div_scalar, cuda::MapOp::kDivScalar); }
Tensor rsub(const Tensor& a, double b) { return scalar_op("rsub", a, b, cpu::rsub_scalar, cuda::MapOp::kRsubScalar); }

Tensor pow(const Tensor& a, double exponent) {
  return unary("pow", a, a.dtype(), [&](const Tensor& out) { cpu::pow_scalar(out, a, exponent); },
               cuda::MapOp::kPowScalar, {.s0 = exponent, .s1 = 0});
}

Tensor& add_(Tensor& a, const Tensor& b, double alpha) {
  check_operands("add_", a, b);
  DTR_CHECK(broadcast_operands("add_", {&a, &b}) == a.shape(), ValueError,
            "add_: {} does not broadcast to the in-place destination {}; only the second operand broadcasts",
            describe(b), describe(a));
  check_writable("add_", a);
  check_no_partial_overlap("add_", a, b);
  check_scalar("add_", a, alpha);
  dispatch_device(
      "add_", a, [&](const Tensor& out) { cpu::add(out, a, b, alpha); },
      [&](const Tensor& out) {
        cuda_map("add_", out, {&a, &b}, a.dtype(), cuda::MapOp::kAdd, {.s0 = alpha, .s1 = 0});
      });
  return a;
}

Tensor& mul_(Tensor& a, double b) {
  check_defined("mul_", a);
  check_writable("mul_", a);
  check_scalar("mul_", a, b);
  dispatch_device(
      "mul_", a, [&](const Tensor& out) { cpu::mul_scalar(out, a, b); },
      [&](const Tensor& out) { cuda_map("mul_", out, {&a}, a.dtype(), cuda::MapOp::kMulScalar, {.s0 = b, .s1 = 0}); });
  return a;
}

Tensor& relu_(Tensor& a) {
  check_defined("relu_", a);
  check_writable("relu_", a);
  dispatch_device(
      "relu_", a, [&](const Tensor& out) { cpu::relu(out, a); },
      [&](const Tensor& out) { cuda_map("relu_", out, {&a}, a.dtype(), cuda::MapOp::kRelu, {}); });
  return a;
}

Tensor neg(const Tensor& x) { return unary("neg", x, cpu::neg, cuda::MapOp::kNeg); }
Tensor abs(const Tensor& x) { return unary("abs", x, cpu::abs, cuda::MapOp::kAbs); }
Tensor relu(const Tensor& x) { return unary("relu", x, cpu::relu, cuda::MapOp::kRelu); }
Tensor exp(const Tensor& x) { return unary("exp", x, cpu::exp, cuda::MapOp::kExp); }
Tensor log(const Tensor& x) { return unary("log", x, cpu::log, cuda::MapOp::kLog); }
Tensor sqrt(const Tensor& x) { return unary("sqrt", x, cpu::sqrt, cuda::MapOp::kSqrt); }
Tensor rsqrt(const Tensor& x) { return unary("rsqrt", x, cpu::rsqrt, cuda::MapOp::kRsqrt); }
Tensor tanh(const Tensor& x) { return unary("tanh", x, cpu::tanh, cuda::MapOp::kTanh); }
Tensor sigmoid(const Tensor& x) { return unary("sigmoid", x, cpu::sigmoid, cuda::MapOp::kSigmoid); }
Tensor silu(const Tensor& x) { return unary("silu", x, cpu::silu, cuda::MapOp::kSilu); }

Tensor gelu(const Tensor& x, GeluApproximation approximate) {
  return unary(
      "gelu", x, x.dtype(), [&](const Tensor& out) { cpu::gelu(out, x, approximate); },
      approximate == GeluApproximation::kTanh ? cuda::MapOp::kGeluTanh : cuda::MapOp::kGelu);
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  check_defined("clamp", x);
  DTR_CHECK(min || max, ValueError, "clamp: {}: at least one of min and max must be given", describe(x));
  if (min) check_scalar("clamp", x, *min);
  if (max) check_scalar("clamp", x, *max);
  constexpr double kInf = std::numeric_limits<double>::infinity();  // the CUDA kernel clamps it to integer ranges
  return unary("clamp", x, x.dtype(), [&](const Tensor& out) { cpu::clamp(out, x, min, max); }, cuda::MapOp::kClamp,
               {.s0 = min.value_or(-kInf), .s1 = max.value_or(kInf)});
}

Tensor relu_backward(const Tensor& grad, const Tensor& x) {
  return binary("relu_backward", grad, x, cpu::relu_backward, cuda::MapOp::kReluBackward);
}
Tensor silu_backward(const Tensor& grad, const Tensor& x) {
  return binary("silu_backward", grad, x, cpu::silu_backward, cuda::MapOp::kSiluBackward);
}
Tensor sigmoid_backward(const Tensor& grad, const Tensor& y) {
  return binary("sigmoid_backward", grad, y, cpu::sigmoid_backward, cuda::MapOp::kSigmoidBackward);
}
Tensor tanh_backward(const Tensor& grad, const Tensor& y) {
  return binary("tanh_backward", grad, y, cpu::tanh_backward, cuda::MapOp::kTanhBackward);
}

Tensor gelu_backward(const Tensor& grad, const Tensor& x, GeluApproximation approximate) {
  return binary(
      "gelu_backward", grad, x, grad.dtype(), [&](const Tensor& out) { cpu::gelu_backward(out, grad, x, approximate); },
      approximate == GeluApproximation::kTanh ? cuda::MapOp::kGeluTanhBackward : cuda::MapOp::kGeluBackward);
}

Tensor eq(const Tensor& a, const Tensor& b) { return comparison(cpu::CompareOp::kEq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return comparison(cpu::CompareOp::kNe, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return comparison(cpu::CompareOp::kLt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return comparison(cpu::CompareOp::kLe, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return comparison(cpu::CompareOp::kGt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return comparison(cpu::CompareOp::kGe, a, b); }
Tensor eq(const Tensor& a, double b) { return comparison(cpu::CompareOp::kEq, a, b); }
Tensor ne(const Tensor& a, double b) { return comparison(cpu::CompareOp::kNe, a, b); }
Tensor lt(const Tensor& a, double b) { return comparison(cpu::CompareOp::kLt, a, b); }
Tensor le(const Tensor& a, double b) { return comparison(cpu::CompareOp::kLe, a, b); }
Tensor gt(const Tensor& a, double b) { return comparison(cpu::CompareOp::kGt, a, b); }
Tensor ge(const Tensor& a, double b) { return comparison(cpu::CompareOp::kGe, a, b); }

Tensor logical_not(const Tensor& x) {
  return unary(
      "logical_not", x, kBool, [&](const Tensor& out) { cpu::logical_not(out, x); }, cuda::MapOp::kLogicalNot);
}

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  check_operands("where", a, b);
  check_bool_operand("where", "condition", condition, a);
  Tensor out = Tensor::empty(broadcast_operands("where", {&condition, &a, &b}), a.dtype(), a.device());
  dispatch_device(
      "where", out, [&](const Tensor& o) { cpu::where(o, condition, a, b); },
      [&](const Tensor& o) {
        cuda_map("where", o, {&condition, &a, &b}, a.dtype(), cuda::MapOp::kWhere);
      });
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined("masked_fill", x);
  check_bool_operand("masked_fill", "mask", mask, x);
  check_scalar("masked_fill", x, value);
  Tensor out = Tensor::empty(broadcast_operands("masked_fill", {&x, &mask}), x.dtype(), x.device());
  dispatch_device(
      "masked_fill", out, [&](const Tensor& o) { cpu::masked_fill(o, x, mask, value); },
      [&](const Tensor& o) {
        cuda_map("masked_fill", o, {&x, &mask}, x.dtype(), cuda::MapOp::kMaskedFill, {.s0 = value, .s1 = 0});
      });
  return out;
}

}  // namespace dtr
