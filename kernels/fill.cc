#include "kernels/fill.h"

#include <cmath>

#include "core/cpu/copy.h"
#include "core/cuda/fill_copy.h"
#include "core/cuda/stream.h"
#include "core/trace.h"

namespace dtr {

Tensor& fill_(Tensor& t, double value) {
  const trace::Span span("fill_", trace::Category::kKernel);
  switch (t.device().type) {
    case kCPU: cpu::fill(t, value); return t;
    case kCUDA:
      DTR_CHECK(t.is_contiguous(), NotImplementedError, "fill_: {} is a strided CUDA view; fill a contiguous tensor",
                describe(t));
      cuda::fill(t.data(), t.dtype(), t.numel(), value, t.device().index,
                 cuda::current_stream(t.device().index).handle());
      return t;
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor full(Shape shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(std::move(shape), dtype, device);
  fill_(t, value);
  return t;
}

Tensor zeros(Shape shape, DType dtype, Device device) { return full(std::move(shape), 0.0, dtype, device); }
Tensor ones(Shape shape, DType dtype, Device device) { return full(std::move(shape), 1.0, dtype, device); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  DTR_CHECK(step != 0.0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step), ValueError,
            "arange: start {}, end {}, step {}: step must be non-zero and all finite", start, end, step);
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((end - start) / step)));
  if (dtype == kBool) throw_dtype_not_implemented("arange", dtype);  // also when n = 0, on every device
  Tensor t = Tensor::empty({n}, dtype, device);
  const trace::Span span("arange", trace::Category::kKernel);
  switch (device.type) {
    case kCPU:
      // start + i * step rounded once (a fused multiply-add), as the CUDA kernel computes it.
      dispatch_numeric(dtype, "arange", [&]<class T>(TypeTag<T>) {
        T* p = t.data_ptr<T>();
        for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(std::fma(static_cast<double>(i), step, start));
      });
      return t;
    case kCUDA:
      cuda::arange(t.data(), dtype, n, start, step, device.index, cuda::current_stream(device.index).handle());
      return t;
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
