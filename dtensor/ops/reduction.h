// Reductions on DTensors: differentiable, each with its sharding rule (PyTorch's
// _math_ops reductions).
//
// sum over dims: a Shard on a reduced dim becomes Partial(sum) (each rank sums its rows;
// the total is their sum), a Shard on a kept dim stays (re-indexed without keepdim),
// Replicate stays, P(sum)/P(avg) stay (sum is linear). Backward broadcasts the gradient
// back over the reduced dims.
#pragma once

#include <vector>

#include "dtensor/dtensor.h"
#include "kernels/reduce.h"

namespace dtr {

// Sum over `dims` (empty: every dim).
DTensor sum(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);

}  // namespace dtr
