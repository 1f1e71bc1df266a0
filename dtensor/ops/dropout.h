// Dropout on DTensors, differentiable, with its sharding rule (kernels/dropout.h with the
// output's ShardLayout: the global shape and this rank's offset in it).
//
// The mask is a function of (seed, global element index) only, so the same seed drops the
// same elements of the global tensor under any placements, on any mesh. Per mesh dim:
//   S(k) -> S(k)    each rank draws the mask of its own elements by global index
//   R -> R          every rank draws the same mask
//   P(op) -> P(op)  op in {sum, avg}: for a fixed mask the op is linear
// Backward: the same dropout (p, seed, global indices) on the gradient, so no mask is
// saved: grad_x = grad_y * mask / (1 - p).
#pragma once

#include <cstdint>

#include "dtensor/dtensor.h"

namespace dtr {

// x * mask / (1 - p), mask keeping each element with probability 1 - p (p in [0, 1],
// ValueError otherwise). Floating dtypes. torch.nn.functional.dropout in training mode,
// with an explicit seed.
DTensor dropout(const DTensor& x, double p, uint64_t seed);

}  // namespace dtr
