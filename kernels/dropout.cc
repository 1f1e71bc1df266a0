#include "kernels/dropout.h"

#include "core/cuda/stream.h"
#include "core/cuda_map_layout.h"
#include "core/trace.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cuda/dropout.h"
#include "kernels/fill.h"
#include "kernels/random.h"

namespace dtr {
namespace {

void check_p(double p, const Tensor& t, std::string_view op) {
  DTR_CHECK(p >= 0.0 && p <= 1.0, ValueError, "{}: p = {} for {}; the drop probability must lie in [0, 1]", op, p,
            describe(t));
}

// 1 / (1 - p), and 0 for p = 1 where nothing is kept.
double keep_scale(double p) { return p == 1.0 ? 0.0 : 1.0 / (1.0 - p); }

// out = mask ? x * scale : 0 on x's CUDA device; out contiguous, x and mask any strides.
void cuda_masked_scale(const Tensor& out, const Tensor& x, const Tensor& mask, double scale, std::string_view op) {
  const cuda::MapShape shape = internal::map_shape(op, x.shape());
  const int device = x.device().index;
  cuda::masked_scale(internal::map_operand(out, x.shape()), internal::map_operand(x, x.shape()),
                     internal::map_operand(mask, x.shape()), shape, scale, x.dtype(), device,
                     cuda::current_stream(device).handle());
}

}  // namespace

DropoutOutput dropout(const Tensor& x, double p, uint64_t seed, const std::optional<ShardLayout>& layout) {
  check_p(p, x, "dropout");
  DTR_CHECK(is_floating(x.dtype()), TypeError,
            "dropout: input {} is not floating; dropout takes float32, float64, bfloat16 or float16", describe(x));
  resolve_shard_layout(x, layout, "dropout");
  const trace::Span span("dropout", trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU: {
      if (p == 0.0) return {x, ones(x.shape(), kBool)};
      if (p == 1.0) return {zeros(x.shape(), x.dtype()), zeros(x.shape(), kBool)};
      Tensor mask = bernoulli(x.shape(), 1.0 - p, seed, kBool, layout);
      Tensor y = Tensor::empty(x.shape(), x.dtype());
      cpu::masked_scale(y, x, mask, keep_scale(p));
      return {y, mask};
    }
    case kCUDA: {
      if (p == 0.0) return {x, ones(x.shape(), kBool, x.device())};
      if (p == 1.0) return {zeros(x.shape(), x.dtype(), x.device()), zeros(x.shape(), kBool, x.device())};
      // The same mask as the CPU's: bernoulli draws it on the device bit for bit alike.
      Tensor mask = bernoulli(x.shape(), 1.0 - p, seed, kBool, layout, x.device());
      Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
      cuda_masked_scale(y, x, mask, keep_scale(p), "dropout");
      return {y, mask};
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor dropout_backward(const Tensor& grad_y, const Tensor& mask, double p) {
  check_p(p, grad_y, "dropout_backward");
  DTR_CHECK(mask.dtype() == kBool && mask.shape() == grad_y.shape() && mask.device() == grad_y.device(), ValueError,
            "dropout_backward: mask {} must be the forward's bool mask of grad_y's shape and device ({})",
            describe(mask), describe(grad_y));
  DTR_CHECK(is_floating(grad_y.dtype()), TypeError,
            "dropout_backward: grad_y {} is not floating; it takes float32, float64, bfloat16 or float16",
            describe(grad_y));
  if (p == 0.0) return grad_y;
  Tensor grad_x = Tensor::empty(grad_y.shape(), grad_y.dtype(), grad_y.device());
  const trace::Span span("dropout_backward", trace::Category::kKernel);
  switch (grad_y.device().type) {
    case kCPU: cpu::masked_scale(grad_x, grad_y, mask, keep_scale(p)); return grad_x;
    case kCUDA: cuda_masked_scale(grad_x, grad_y, mask, keep_scale(p), "dropout_backward"); return grad_x;
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
