#include "kernels/random.h"

#include <cmath>

#include "kernels/cpu/random.h"
#include "kernels/internal/check_writable.h"
#include "kernels/internal/device_not_implemented.h"
#include "kernels/trace.h"

namespace dtr {
namespace {

// Random ops fill floating tensors, writing every element once.
void check_fillable(const Tensor& t, std::string_view op) {
  DTR_CHECK(is_floating(t.dtype()), TypeError,
            "{}: {} is not a floating tensor; {} fills float32, float64, bfloat16 or float16", op, describe(t), op);
  internal::check_writable(op, t);
}

}  // namespace

Tensor& uniform_(Tensor& t, double lo, double hi, uint64_t seed, const std::optional<ShardLayout>& layout) {
  check_fillable(t, "uniform_");
  DTR_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, ValueError,
            "uniform_: bounds [{}, {}) for {}: need finite lo <= hi", lo, hi, describe(t));
  const ShardLayout l = resolve_shard_layout(t, layout, "uniform_");
  const trace::Span span("uniform_", trace::Category::kKernel);
  switch (t.device().type) {
    case kCPU: cpu::uniform(t, lo, hi, seed, l); return t;
    case kCUDA: throw_device_not_implemented("uniform_", t.device(), describe(t));
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
    case kCUDA: throw_device_not_implemented("normal_", t.device(), describe(t));
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor bernoulli(Shape shape, double p, uint64_t seed, DType dtype, const std::optional<ShardLayout>& layout,
                 Device device) {
  DTR_CHECK(p >= 0.0 && p <= 1.0, ValueError, "bernoulli: p = {} for shape {}; p must lie in [0, 1]", p, shape);
  const trace::Span span("bernoulli", trace::Category::kKernel);
  switch (device.type) {
    case kCPU: {
      Tensor t = Tensor::empty(std::move(shape), dtype, device);
      cpu::bernoulli(t, p, seed, resolve_shard_layout(t, layout, "bernoulli"));
      return t;
    }
    case kCUDA: throw_device_not_implemented("bernoulli", device, fmt::format("{}{}", dtype, shape));
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
