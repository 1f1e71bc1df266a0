// The dtypes Gloo collectives move and reduce: float32, float64, int32 and int64.
//
// bfloat16 and float16 never reach the wire of a reduction: they are widened to float32,
// reduced, and rounded once at the end (exact whenever the float32 result is), because a
// reduction that rounds to 8 or 11 bits after every hop loses more with every rank.
// dispatch_wire is the one dtype dispatch of the Gloo backend's reductions; combine and
// divide_by are the arithmetic they share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "collectives/reduce_op.h"
#include "core/dtype.h"
#include "core/error.h"

namespace dtr {

inline bool is_half_precision(DType d) { return d == kBFloat16 || d == kFloat16; }

// Calls f(TypeTag<T>{}) for a wire dtype; any other is a dtr bug (the caller widens first).
template <class F>
decltype(auto) dispatch_wire(DType dtype, F&& f) {
  switch (dtype) {
    case kFloat32: return f(TypeTag<float>{});
    case kFloat64: return f(TypeTag<double>{});
    case kInt32: return f(TypeTag<int32_t>{});
    case kInt64: return f(TypeTag<int64_t>{});
    default: DTR_INTERNAL_ASSERT(false, "gloo: {} reached the wire; reductions widen it to float32 first", dtype);
  }
}

// out[i] = op(a[i], b[i]) (avg adds: divide_by finishes it); out may alias a or b.
template <class T>
void combine(T* out, const T* a, const T* b, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      return;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      return;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      return;
  }
}

// The second half of avg: p[i] /= ranks (a true division, not a multiplication by 1/ranks).
template <class T>
void divide_by(T* p, int64_t n, int ranks) {
  if constexpr (std::is_floating_point_v<T>) {
    for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<T>(ranks);
  }
}

}  // namespace dtr
