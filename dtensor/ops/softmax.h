// softmax and log_softmax along one dim of a DTensor, differentiable, with their sharding
// rule (PyTorch's _softmax / _log_softmax strategies).
//
// Rules per mesh dim (the normalised dim `dim` needs every element of a slice):
//   x        -> out      why it is exact
//   S(k)     -> S(k)     k != dim: slices along dim lie whole on one rank
//   R        -> R
// S(dim) is gathered first (all-gather); Partial inputs are reduced first (the op is not
// linear). Backward is a DTensor op of its own over the fused kernels (softmax.h): grad_y
// and the saved output y both S(k) (k != dim) -> S(k); R, R -> R; and P(op), R -> P(op)
// for op in {sum, avg}, since grad_x is linear in grad_y for a fixed y.
#pragma once

#include "dtensor/dtensor.h"

namespace dtr {

// exp(x - max) / sum(exp(x - max)) along dim. Floating dtypes.
DTensor softmax(const DTensor& x, int64_t dim);
// x - max - log(sum(exp(x - max))) along dim. Floating dtypes.
DTensor log_softmax(const DTensor& x, int64_t dim);

}  // namespace dtr
