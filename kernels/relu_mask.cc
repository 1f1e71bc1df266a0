#include "kernels/relu_mask.h"

#include "core/check_writable.h"
#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/cpu/relu_mask.h"
#include "kernels/cuda/relu_mask.h"

namespace dtr {

Tensor relu_mask(const Tensor& y) {
  DTR_CHECK(y.defined() && y.is_contiguous(), ValueError, "relu_mask: y {} must be a contiguous tensor (relu's output)",
            describe(y));
  DTR_CHECK(is_floating(y.dtype()), TypeError,
            "relu_mask: y {} is not floating; it takes float32, float64, bfloat16 or float16", describe(y));
  Tensor words = Tensor::empty({(y.numel() + 31) / 32}, kInt32, y.device());
  const trace::Span span("relu_mask", trace::Category::kKernel);
  switch (y.device().type) {
    case kCPU: cpu::relu_mask(words, y); return words;
    case kCUDA: {
      const int device = y.device().index;
      cuda::relu_mask(reinterpret_cast<uint32_t*>(words.data_ptr<int32_t>()), y.data(), y.numel(), y.dtype(), device,
                      cuda::current_stream(device).handle());
      return words;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor& apply_relu_mask_(Tensor& grad, const Tensor& mask) {
  DTR_CHECK(grad.defined() && grad.is_contiguous(), ValueError, "apply_relu_mask_: grad {} must be contiguous",
            describe(grad));
  DTR_CHECK(is_floating(grad.dtype()), TypeError,
            "apply_relu_mask_: grad {} is not floating; it takes float32, float64, bfloat16 or float16",
            describe(grad));
  DTR_CHECK(mask.defined() && mask.dtype() == kInt32 && mask.dim() == 1 && mask.is_contiguous() &&
                mask.size(0) == (grad.numel() + 31) / 32 && mask.device() == grad.device(),
            ValueError, "apply_relu_mask_: mask {} must be relu_mask's words for grad {}: int32[{}] on its device",
            describe(mask), describe(grad), (grad.numel() + 31) / 32);
  internal::check_writable("apply_relu_mask_", grad);
  const trace::Span span("apply_relu_mask_", trace::Category::kKernel);
  switch (grad.device().type) {
    case kCPU: cpu::apply_relu_mask(grad, mask); return grad;
    case kCUDA: {
      const int device = grad.device().index;
      cuda::apply_relu_mask(grad.data(), reinterpret_cast<const uint32_t*>(mask.data_ptr<int32_t>()), grad.numel(),
                            grad.dtype(), device, cuda::current_stream(device).handle());
      return grad;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
