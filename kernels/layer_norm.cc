#include "kernels/layer_norm.h"

#include <cmath>

#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cuda/layer_norm.h"

namespace dtr {
namespace {

// x's dims before the last k: the shape of mean and rstd.
Shape row_shape(const Tensor& x, int64_t k) { return Shape(x.shape().begin(), x.shape().end() - k); }

// weight or bias, if given, must be a normalized_shape tensor of x's dtype and device.
void check_affine(const std::optional<Tensor>& t, const Tensor& x, const Shape& normalized_shape, std::string_view name,
                  std::string_view op) {
  if (!t) return;
  DTR_CHECK(t->shape() == normalized_shape && t->dtype() == x.dtype() && t->device() == x.device(), ValueError,
            "{}: {} {} must have shape {} and the dtype and device of the input {}", op, name, describe(*t),
            normalized_shape, describe(x));
}

// The data of an optional operand, contiguous (held in `keep`), or nullptr.
const void* data_or_null(const std::optional<Tensor>& t, Tensor& keep) {
  if (!t) return nullptr;
  keep = t->contiguous();
  return keep.data();
}

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace

LayerNormOutput layer_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight,
                           const std::optional<Tensor>& bias, double eps) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  DTR_CHECK(is_floating(x.dtype()), TypeError,
            "layer_norm: input {} is not floating; layer_norm takes float32, float64, bfloat16 or float16",
            describe(x));
  DTR_CHECK(k >= 1 && k <= x.dim() && Shape(x.shape().end() - k, x.shape().end()) == normalized_shape, ValueError,
            "layer_norm: normalized_shape {} must be non-empty and equal the last dims of the input {}",
            normalized_shape, describe(x));
  DTR_CHECK(eps >= 0.0 && std::isfinite(eps), ValueError, "layer_norm: eps {} must be finite and >= 0", eps);
  check_affine(weight, x, normalized_shape, "weight", "layer_norm");
  check_affine(bias, x, normalized_shape, "bias", "layer_norm");
  LayerNormOutput out{.y = Tensor::empty(x.shape(), x.dtype(), x.device()),
                      .mean = Tensor::empty(row_shape(x, k), acc_dtype(x.dtype()), x.device()),
                      .rstd = Tensor::empty(row_shape(x, k), acc_dtype(x.dtype()), x.device())};
  const trace::Span span("layer_norm", trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU:
      cpu::layer_norm(out.y, out.mean, out.rstd, x, weight.value_or(Tensor()), bias.value_or(Tensor()), eps);
      return out;
    case kCUDA: {
      Tensor keep_weight, keep_bias;
      const Tensor xc = x.contiguous();
      const int device = x.device().index;
      cuda::layer_norm(out.y.data(), out.mean.data(), out.rstd.data(), xc.data(), data_or_null(weight, keep_weight),
                       data_or_null(bias, keep_bias), out.mean.numel(), numel_of(normalized_shape), eps, x.dtype(),
                       device, cuda::current_stream(device).handle());
      return out;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

LayerNormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const std::optional<Tensor>& weight) {
  constexpr std::string_view op = "layer_norm_backward";
  DTR_CHECK(is_floating(x.dtype()), TypeError,
            "{}: input {} is not floating; layer_norm takes float32, float64, bfloat16 or float16", op, describe(x));
  DTR_CHECK(grad_y.shape() == x.shape() && grad_y.dtype() == x.dtype() && grad_y.device() == x.device(), ValueError,
            "{}: grad_y {} must have the shape, dtype and device of the input {}", op, describe(grad_y), describe(x));
  const int64_t k = x.dim() - mean.dim();
  const DType stats_dtype = acc_dtype(x.dtype());
  DTR_CHECK(k >= 1 && mean.shape() == row_shape(x, k) && rstd.shape() == mean.shape() && mean.dtype() == stats_dtype &&
                rstd.dtype() == stats_dtype && mean.device() == x.device() && rstd.device() == x.device(),
            ValueError,
            "{}: mean {} and rstd {} must be the forward's saved statistics of the input {} (one {} value per row "
            "over its last dims)",
            op, describe(mean), describe(rstd), describe(x), dtype_name(stats_dtype));
  const Shape normalized_shape(x.shape().end() - k, x.shape().end());
  check_affine(weight, x, normalized_shape, "weight", op);
  LayerNormGrads grads{.grad_x = Tensor::empty(x.shape(), x.dtype(), x.device()),
                       .grad_weight = Tensor::empty(normalized_shape, x.dtype(), x.device()),
                       .grad_bias = Tensor::empty(normalized_shape, x.dtype(), x.device())};
  const trace::Span span(op, trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU:
      cpu::layer_norm_backward(grads.grad_x, grads.grad_weight, grads.grad_bias, grad_y, x, mean, rstd,
                               weight.value_or(Tensor()));
      return grads;
    case kCUDA: {
      Tensor keep_weight;
      const Tensor gy = grad_y.contiguous(), xc = x.contiguous(), m = mean.contiguous(), r = rstd.contiguous();
      const int64_t rows = mean.numel(), n = numel_of(normalized_shape);
      const Tensor partials = Tensor::empty({2 * cuda::layer_norm_backward_chunks(rows) * n}, stats_dtype, x.device());
      const int device = x.device().index;
      cuda::layer_norm_backward(grads.grad_x.data(), grads.grad_weight.data(), grads.grad_bias.data(), gy.data(),
                                xc.data(), m.data(), r.data(), data_or_null(weight, keep_weight), partials.data(), rows,
                                n, x.dtype(), device, cuda::current_stream(device).handle());
      return grads;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
