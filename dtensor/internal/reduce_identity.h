// The identity of a reduction: the value x with op(x, y) = y for every y of a dtype.
#pragma once

#include "collectives/reduce_op.h"
#include "core/tensor.h"

namespace dtr::internal {

// A tensor of shape `shape` filled with op's identity for values of dtype `values`: 0 for
// sum, the lowest value for max (-inf for floating dtypes, false for bool), the highest for
// min; stored as `storage` (bool masks travel as int32). Integer limits are exact (int64's
// highest has no double). avg has no identity: an internal error.
Tensor full_of_identity(Shape shape, ReduceOp op, DType values, DType storage, Device device);

}  // namespace dtr::internal
