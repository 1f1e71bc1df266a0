// The dtypes Gloo collectives move and reduce: float32, float64, int32 and int64.
//
// bfloat16 and float16 never reach the wire of a reduction: they are widened to float32,
// reduced, and rounded once at the end (exact whenever the float32 result is), because a
// reduction that rounds to 8 or 11 bits after every hop loses more with every rank.
// dispatch_wire is the one dtype dispatch of the Gloo backend's reductions.
#pragma once

#include "kernels/dtype.h"
#include "kernels/error.h"

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

}  // namespace dtr
