#include "kernels/rms_norm.h"

#include <cmath>
#include <limits>

#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cuda/rms_norm.h"

namespace dtr {
namespace {

// x's dims before the last k: the shape of rstd.
Shape row_shape(const Tensor& x, int64_t k) { return Shape(x.shape().begin(), x.shape().end() - k); }

// weight, if given, must be a normalized_shape tensor of x's dtype and device.
void check_weight(const std::optional<Tensor>& weight, const Tensor& x, const Shape& normalized_shape,
                  std::string_view op) {
  if (!weight) return;
  DTR_CHECK(weight->shape() == normalized_shape && weight->dtype() == x.dtype() && weight->device() == x.device(),
            ValueError, "{}: weight {} must have shape {} and the dtype and device of the input {}", op,
            describe(*weight), normalized_shape, describe(x));
}

void check_floating(const Tensor& x, std::string_view op) {
  DTR_CHECK(is_floating(x.dtype()), TypeError,
            "{}: input {} is not floating; rms_norm takes float32, float64, bfloat16 or float16", op, describe(x));
}

// The weight's data, contiguous (held in `keep`), or nullptr.
const void* data_or_null(const std::optional<Tensor>& t, Tensor& keep) {
  if (!t) return nullptr;
  keep = t->contiguous();
  return keep.data();
}

}  // namespace

double rms_norm_default_eps(DType dtype) {
  switch (dtype) {
    case kFloat64: return std::numeric_limits<double>::epsilon();
    case kBFloat16: return 0.0078125;    // 2^-7
    case kFloat16: return 0.0009765625;  // 2^-10
    default: return std::numeric_limits<float>::epsilon();
  }
}

RMSNormOutput rms_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight,
                       std::optional<double> eps) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  check_floating(x, "rms_norm");
  DTR_CHECK(k >= 1 && k <= x.dim() && Shape(x.shape().end() - k, x.shape().end()) == normalized_shape, ValueError,
            "rms_norm: normalized_shape {} must be non-empty and equal the last dims of the input {}", normalized_shape,
            describe(x));
  const double e = eps.value_or(rms_norm_default_eps(x.dtype()));
  DTR_CHECK(e >= 0.0 && std::isfinite(e), ValueError, "rms_norm: eps {} must be finite and >= 0 (input {})", e,
            describe(x));
  check_weight(weight, x, normalized_shape, "rms_norm");
  RMSNormOutput out{.y = Tensor::empty(x.shape(), x.dtype(), x.device()),
                    .rstd = Tensor::empty(row_shape(x, k), acc_dtype(x.dtype()), x.device())};
  const trace::Span span("rms_norm", trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU: cpu::rms_norm(out.y, out.rstd, x, weight.value_or(Tensor()), e); return out;
    case kCUDA: {
      Tensor keep_weight;
      const Tensor xc = x.contiguous();
      const int device = x.device().index;
      cuda::rms_norm(out.y.data(), out.rstd.data(), xc.data(), data_or_null(weight, keep_weight), out.rstd.numel(),
                     shape_numel(normalized_shape), e, x.dtype(), device, cuda::current_stream(device).handle());
      return out;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

RMSNormGrads rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& rstd,
                               const std::optional<Tensor>& weight) {
  constexpr std::string_view op = "rms_norm_backward";
  check_floating(x, op);
  DTR_CHECK(grad_y.shape() == x.shape() && grad_y.dtype() == x.dtype() && grad_y.device() == x.device(), ValueError,
            "{}: grad_y {} must have the shape, dtype and device of the input {}", op, describe(grad_y), describe(x));
  const int64_t k = x.dim() - rstd.dim();
  const DType stats_dtype = acc_dtype(x.dtype());
  DTR_CHECK(k >= 1 && rstd.shape() == row_shape(x, k) && rstd.dtype() == stats_dtype && rstd.device() == x.device(),
            ValueError,
            "{}: rstd {} must be the forward's saved statistic of the input {} (one {} value per row over its last "
            "dims)",
            op, describe(rstd), describe(x), dtype_name(stats_dtype));
  const Shape normalized_shape(x.shape().end() - k, x.shape().end());
  check_weight(weight, x, normalized_shape, op);
  RMSNormGrads grads{.grad_x = Tensor::empty(x.shape(), x.dtype(), x.device()),
                     .grad_weight = Tensor::empty(normalized_shape, x.dtype(), x.device())};
  const trace::Span span(op, trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU:
      cpu::rms_norm_backward(grads.grad_x, grads.grad_weight, grad_y, x, rstd, weight.value_or(Tensor()));
      return grads;
    case kCUDA: {
      Tensor keep_weight;
      const Tensor gy = grad_y.contiguous(), xc = x.contiguous(), r = rstd.contiguous();
      const int64_t rows = rstd.numel(), n = shape_numel(normalized_shape);
      const Tensor partials = Tensor::empty({cuda::rms_norm_backward_chunks(rows) * n}, stats_dtype, x.device());
      const int device = x.device().index;
      cuda::rms_norm_backward(grads.grad_x.data(), grads.grad_weight.data(), gy.data(), xc.data(), r.data(),
                              data_or_null(weight, keep_weight), partials.data(), rows, n, x.dtype(), device,
                              cuda::current_stream(device).handle());
      return grads;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
