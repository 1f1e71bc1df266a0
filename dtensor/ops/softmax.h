// softmax and log_softmax along one dim of a DTensor, differentiable, with their sharding
// rule (PyTorch's _softmax / _log_softmax strategies).
//
// Rules per mesh dim (the normalised dim `dim` needs every element of a slice):
//   x        -> out      why it is exact
//   S(k)     -> S(k)     k != dim: slices along dim lie whole on one rank
//   R        -> R
// S(dim) is gathered first (all-gather); Partial inputs are reduced first (the op is not
// linear). The backward's rules: docs/sharding_rules.md, "softmax".
#pragma once

#include "dtensor/dtensor.h"

namespace dtr {

// exp(x - max) / sum(exp(x - max)) along dim. Floating dtypes.
DTensor softmax(const DTensor& x, int64_t dim);
// x - max - log(sum(exp(x - max))) along dim. Floating dtypes.
DTensor log_softmax(const DTensor& x, int64_t dim);

}  // namespace dtr
