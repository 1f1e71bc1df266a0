#include "kernels/softmax.h"

#include "kernels/cpu/softmax.h"
#include "kernels/internal/device_not_implemented.h"
#include "kernels/trace.h"

namespace dtr {
namespace {

using cpu::SoftmaxKind;

Tensor softmax_forward(const Tensor& x, int64_t dim, SoftmaxKind kind, std::string_view op) {
  DTR_CHECK(is_floating(x.dtype()), TypeError,
            "{}: input {} is not floating; {} takes float32, float64, bfloat16 or float16", op, describe(x), op);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const trace::Span span(op, trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU: cpu::softmax(y, x, d, kind); return y;
    case kCUDA: throw_device_not_implemented(op, x.device(), describe(x));
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor backward(const Tensor& grad_y, const Tensor& y, int64_t dim, SoftmaxKind kind, std::string_view op) {
  DTR_CHECK(grad_y.shape() == y.shape() && grad_y.dtype() == y.dtype() && grad_y.device() == y.device(), ValueError,
            "{}: grad_y {} and y {} must have the same shape, dtype and device", op, describe(grad_y), describe(y));
  DTR_CHECK(is_floating(y.dtype()), TypeError,
            "{}: y {} is not floating; {} takes float32, float64, bfloat16 or float16", op, describe(y), op);
  const int64_t d = wrap_dim(dim, y.dim(), op);
  Tensor grad_x = Tensor::empty(y.shape(), y.dtype(), y.device());
  const trace::Span span(op, trace::Category::kKernel);
  switch (y.device().type) {
    case kCPU: cpu::softmax_backward(grad_x, grad_y, y, d, kind); return grad_x;
    case kCUDA: throw_device_not_implemented(op, y.device(), fmt::format("{} and {}", describe(grad_y), describe(y)));
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_forward(x, dim, SoftmaxKind::kSoftmax, "softmax"); }

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_forward(x, dim, SoftmaxKind::kLogSoftmax, "log_softmax");
}

Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim) {
  return backward(grad_y, y, dim, SoftmaxKind::kSoftmax, "softmax_backward");
}

Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim) {
  return backward(grad_y, y, dim, SoftmaxKind::kLogSoftmax, "log_softmax_backward");
}

}  // namespace dtr
