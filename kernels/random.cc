#include "kernels/random.h"

#include <cmath>

#include "core/check_writable.h"
#include "core/cuda/stream.h"
#include "core/cuda_map_layout.h"
#include "core/trace.h"
#include "kernels/cpu/random.h"
#include "kernels/cuda/random.h"

namespace dtr {
namespace {

// Random ops fill floating tensors, writing every element once.
void check_fillable(const Tensor& t, std::string_view op) {
  DTR_CHECK(is_floating(t.dtype()), TypeError,
            "{}: {} is not a floating tensor; {} fills float32, float64, bfloat16 or float16", op, describe(t), op);
  internal::check_writable(op, t);
}

// t's elements as the CUDA kernels address them: its strides over its shape, and each
// element's global index under layout.
struct CudaTarget {
  cuda::MapOperand t;
  cuda::MapShape shape;
  cuda::GlobalIndex global;
};

CudaTarget cuda_target(const Tensor& t, const ShardLayout& layout, std::string_view op) {
  DTR_CHECK(t.dim() <= cuda::kMaxMapDims, NotImplementedError,
            "{}: {} has {} dims; the CUDA random kernels take at most {}", op, describe(t), t.dim(), cuda::kMaxMapDims);
  CudaTarget c;
  c.shape = internal::map_shape(op, t.shape());
  c.t.data = t.numel() > 0 ? t.data() : nullptr;
  const Shape global_strides = contiguous_strides(layout.global_shape);
  for (int64_t d = 0; d < t.dim(); ++d) {
    c.t.strides[d] = t.stride(d);
    c.global.strides[d] = global_strides[d];
    c.global.base += layout.offset[d] * global_strides[d];
  }
  return c;
}

cudaStream_t stream_of(const Tensor& t) { return cuda::current_stream(t.device().index).handle(); }

}  // namespace

Tensor& uniform_(Tensor& t, double lo, double hi, uint64_t seed, const std::optional<ShardLayout>& layout) {
  check_fillable(t, "uniform_");
  DTR_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, ValueError,
            "uniform_: bounds [{}, {}) for {}: need finite lo <= hi", lo, hi, describe(t));
  const ShardLayout l = resolve_shard_layout(t, layout, "uniform_");
  const trace::Span span("uniform_", trace::Category::kKernel);
  switch (t.device().type) {
    case kCPU: cpu::uniform(t, lo, hi, seed, l); return t;
    case kCUDA: {
      const CudaTarget c = cuda_target(t, l, "uniform_");
      cuda::uniform(c.t, c.shape, c.global, lo, hi - lo, seed, t.dtype(), t.device().index, stream_of(t));
      return t;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor& normal_(Tensor& t, double mean, double std, uint64_t seed, const std::optional<ShardLayout>& layout) {
  check_fillable(t, "normal_");
  DTR_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0.0, ValueError,
            "normal_: mean {} and std {} for {}: need a finite mean and a finite std >= 0", mean, std, describe(t));
  const ShardLayout l = resolve_shard_layout(t, layout, "normal_");
  const trace::Span span("normal_", trace::Category::kKernel);
  switch (t.device().type) {
    case kCPU: cpu::normal(t, mean, std, seed, l); return t;
    case kCUDA: {
      const CudaTarget c = cuda_target(t, l, "normal_");
      cuda::normal(c.t, c.shape, c.global, mean, std, seed, t.dtype(), t.device().index, stream_of(t));
      return t;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor bernoulli(Shape shape, double p, uint64_t seed, DType dtype, const std::optional<ShardLayout>& layout,
                 Device device) {
  DTR_CHECK(p >= 0.0 && p <= 1.0, ValueError, "bernoulli: p = {} for shape {}; p must lie in [0, 1]", p, shape);
  Tensor t = Tensor::empty(std::move(shape), dtype, device);
  const ShardLayout l = resolve_shard_layout(t, layout, "bernoulli");
  const trace::Span span("bernoulli", trace::Category::kKernel);
  switch (device.type) {
    case kCPU: cpu::bernoulli(t, p, seed, l); return t;
    case kCUDA: {
      const CudaTarget c = cuda_target(t, l, "bernoulli");
      cuda::bernoulli(c.t, c.shape, c.global, p, seed, dtype, device.index, stream_of(t));
      return t;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
