// Embedding lookup on DTensors, differentiable in the weight, with its sharding rule
// (PyTorch's embedding strategy: batch, column-wise and row-wise (masked) sharding).
//
// Rules per mesh dim for weight [V, D] and indices [*] -> out [*, D]; indices never Partial:
//   weight   indices  -> out       why it is exact
//   R        S(k)     -> S(k)      each rank looks up its own positions (data parallel)
//   S(1)     R        -> S(-1)     each rank holds some columns of every row
//   S(0)     R        -> P(sum)    masked: a rank gives zero rows for indices it lacks
//   R        R        -> R;  P(op), R -> P(op) for op in {sum, avg} (linear in the weight)
// The backward's rules: docs/sharding_rules.md, "embedding".
#pragma once

#include "dtensor/dtensor.h"

namespace dtr {

// Rows of weight [V, D] (floating) at indices (int32 or int64, any shape, each in [0, V):
// IndexError otherwise): indices.shape + [D]. torch.nn.functional.embedding(indices, weight),
// with the kernel's argument order (kernels/embedding.h).
DTensor embedding(const DTensor& weight, const DTensor& indices);

}  // namespace dtr
