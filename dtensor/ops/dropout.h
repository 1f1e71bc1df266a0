// Dropout on DTensors, differentiable, with its sharding rule: the mask is a function of
// (seed, global element index) only, so the same seed drops the same elements of the
// global tensor under any placements, on any mesh (kernels/dropout.h with the output's
// ShardLayout: the global shape and this rank's offset in it).
//
// Rules per mesh dim:
//   x       -> y        why it is exact
//   S(k)    -> S(k)     each rank draws the mask of its own elements by global index
//   R       -> R        every rank draws the same mask
//   P(op)   -> P(op)    op in {sum, avg}: for a fixed mask the op is linear, and every term
//                       is masked alike (a Partial dim does not split the index space)
// Backward is the same dropout (same p, seed and global indices) applied to the gradient:
// grad_x = grad_y * mask / (1 - p), so no mask is saved.
#pragma once

#include <cstdint>

#include "dtensor/dtensor.h"

namespace dtr {

// x * mask / (1 - p), mask keeping each element with probability 1 - p (p in [0, 1],
// ValueError otherwise). Floating dtypes. torch.nn.functional.dropout in training mode,
// with an explicit seed.
DTensor dropout(const DTensor& x, double p, uint64_t seed);

}  // namespace dtr
