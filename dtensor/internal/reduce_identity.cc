#include "dtensor/internal/reduce_identity.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "kernels/fill.h"

namespace dtr::internal {

Tensor full_of_identity(Shape shape, ReduceOp op, DType values, DType storage, Device device) {
  DTR_INTERNAL_ASSERT(op != ReduceOp::kAvg, "avg has no identity");
  if (op == ReduceOp::kSum) return zeros(std::move(shape), storage, device);
  const bool lowest = op == ReduceOp::kMax;
  if (values == kBool) return full(std::move(shape), lowest ? 0.0 : 1.0, storage, device);
  if (is_floating(storage)) {
    return full(std::move(shape), (lowest ? -1 : 1) * std::numeric_limits<double>::infinity(), storage, device);
  }
  Tensor t = Tensor::empty(std::move(shape), storage, kCPU);
  dispatch_all(storage, "full_of_identity", [&]<class T>(TypeTag<T>) {
    std::fill_n(t.data_ptr<T>(), t.numel(), lowest ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max());
  });
  return device.is_cpu() ? t : t.to(device);
}

}  // namespace dtr::internal
