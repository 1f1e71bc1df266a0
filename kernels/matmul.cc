#include "kernels/matmul.h"

#include "kernels/cpu/matmul.h"
#include "kernels/internal/device_not_implemented.h"
#include "kernels/trace.h"

namespace dtr {
namespace {

// Checks what matmul and bmm share: floating operands of one dtype on one device.
void check_operands(const Tensor& a, const Tensor& b, std::string_view op) {
  DTR_CHECK(a.dtype() == b.dtype(), TypeError, "{}: operands {} and {} differ in dtype; convert one with .to()", op,
            describe(a), describe(b));
  DTR_CHECK(is_floating(a.dtype()), TypeError,
            "{}: operands {} and {} are not floating; {} takes float32, float64, bfloat16 or float16", op, describe(a),
            describe(b), op);
  DTR_CHECK(a.device() == b.device(), ValueError, "{}: operands {} and {} are on different devices", op, describe(a),
            describe(b));
}

void check_matmul(const Tensor& a, const Tensor& b) {
  DTR_CHECK(a.dim() == 2 && b.dim() == 2, ValueError,
            "matmul: operands {} and {} must both be 2-D ([M, K] x [K, N]); use bmm for batches", describe(a),
            describe(b));
  DTR_CHECK(a.size(1) == b.size(0), ValueError, "matmul: shapes {} and {} cannot be multiplied ({} columns vs {} rows)",
            a.shape(), b.shape(), a.size(1), b.size(0));
  check_operands(a, b, "matmul");
}

void check_bmm(const Tensor& a, const Tensor& b) {
  DTR_CHECK(a.dim() == 3 && b.dim() == 3, ValueError,
            "bmm: operands {} and {} must both be 3-D ([B, M, K] x [B, K, N]); use matmul for 2-D", describe(a),
            describe(b));
  DTR_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), ValueError,
            "bmm: shapes {} and {} cannot be multiplied (need equal batch sizes and {} columns == {} rows)", a.shape(),
            b.shape(), a.size(2), b.size(1));
  check_operands(a, b, "bmm");
}

// out must be able to take the product of a and b (already checked) in place.
void check_out(const Tensor& out, const Tensor& a, const Tensor& b, const Shape& shape, std::string_view op) {
  DTR_CHECK(out.shape() == shape && out.is_contiguous(), ValueError,
            "{}: out {} must be a contiguous {} tensor for {} x {}", op, describe(out), shape, describe(a),
            describe(b));
  DTR_CHECK(out.dtype() == a.dtype() && out.device() == a.device(), TypeError,
            "{}: out {} must have the operands' dtype and device ({})", op, describe(out), describe(a));
  DTR_CHECK(!out.storage().is_same(a.storage()) && !out.storage().is_same(b.storage()), ValueError,
            "{}: out {} shares storage with an operand; write the product to a separate tensor", op, describe(out));
}

// out [B, M, N] = a [B, M, K] b [B, K, N], on the operands' device.
void dispatch_bmm(const Tensor& out, const Tensor& a, const Tensor& b, std::string_view op) {
  const trace::Span span(op, trace::Category::kKernel);
  switch (a.device().type) {
    case kCPU: cpu::bmm(out, a, b); return;
    case kCUDA: throw_device_not_implemented(op, a.device(), fmt::format("{} and {}", describe(a), describe(b)));
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_matmul(a, b);
  Tensor out = Tensor::empty({a.size(0), b.size(1)}, a.dtype(), a.device());
  dispatch_bmm(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), "matmul");
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_bmm(a, b);
  Tensor out = Tensor::empty({a.size(0), a.size(1), b.size(2)}, a.dtype(), a.device());
  dispatch_bmm(out, a, b, "bmm");
  return out;
}

const Tensor& matmul_out(const Tensor& out, const Tensor& a, const Tensor& b) {
  check_matmul(a, b);
  check_out(out, a, b, {a.size(0), b.size(1)}, "matmul_out");
  dispatch_bmm(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), "matmul_out");
  return out;
}

const Tensor& bmm_out(const Tensor& out, const Tensor& a, const Tensor& b) {
  check_bmm(a, b);
  check_out(out, a, b, {a.size(0), a.size(1), b.size(2)}, "bmm_out");
  dispatch_bmm(out, a, b, "bmm_out");
  return out;
}

}  // namespace dtr
