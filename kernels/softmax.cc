#include "kernels/softmax.h"

#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/softmax.h"

namespace dtr {
namespace {

// t with dim d moved last, contiguous: rows of the softmax dim back to back.
Tensor rows_of(const Tensor& t, int64_t d) {
  return t.dim() == 0 ? t.view({1}) : t.transpose(d, t.dim() - 1).contiguous();
}

// Writes a result computed as rows_of-shaped `rows` into `out` (contiguous, the inputs' shape).
void store_rows(const Tensor& out, const Tensor& rows, int64_t d) {
  if (out.dim() == 0 || rows.data() == out.data()) return;
  Tensor o = out;
  o.copy_(rows.transpose(d, out.dim() - 1));
}

// The result tensor the CUDA kernel writes: out itself when the softmax dim is already last.
Tensor rows_out(const Tensor& out, const Tensor& rows, int64_t d) {
  return out.dim() == 0 || d == out.dim() - 1 ? out.view(rows.shape())
                                              : Tensor::empty(rows.shape(), out.dtype(), out.device());
}

void cuda_softmax(const Tensor& y, const Tensor& x, int64_t d, SoftmaxKind kind) {
  const Tensor in = rows_of(x, d), out = rows_out(y, in, d);
  const int64_t cols = in.size(-1), device = x.device().index;
  cuda::softmax(out.data(), in.data(), cols == 0 ? 0 : in.numel() / cols, cols, x.dtype(), kind,
                static_cast<int>(device), cuda::current_stream(static_cast<int>(device)).handle());
  store_rows(y, out, d);
}

void cuda_softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, int64_t d, SoftmaxKind kind) {
  const Tensor gy = rows_of(grad_y, d), yy = rows_of(y, d), out = rows_out(grad_x, yy, d);
  const int64_t cols = yy.size(-1), device = y.device().index;
  cuda::softmax_backward(out.data(), gy.data(), yy.data(), cols == 0 ? 0 : yy.numel() / cols, cols, y.dtype(), kind,
                         static_cast<int>(device), cuda::current_stream(static_cast<int>(device)).handle());
  store_rows(grad_x, out, d);
}

Tensor softmax_forward(const Tensor& x, int64_t dim, SoftmaxKind kind, std::string_view op) {
  DTR_CHECK(is_floating(x.dtype()), TypeError,
            "{}: input {} is not floating; {} takes float32, float64, bfloat16 or float16", op, describe(x), op);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const trace::Span span(op, trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU: cpu::softmax(y, x, d, kind); return y;
    case kCUDA: cuda_softmax(y, x, d, kind); return y;
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
    case kCUDA: cuda_softmax_backward(grad_x, grad_y, y, d, kind); return grad_x;
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
