// Embedding lookup on DTensors, differentiable in the weight, with its sharding rule
// (PyTorch's embedding strategy: batch, column-wise and row-wise (masked) sharding).
//
// Rules per mesh dim for weight [V, D] and indices [*] -> out [*, D]:
//   weight   indices  -> out       why it is exact
//   R        S(k)     -> S(k)      each rank looks up its own positions (data parallel)
//   S(1)     R        -> S(-1)     each rank holds some columns of every row
//   S(0)     R        -> P(sum)    masked lookup: a rank holding rows [r0, r1) returns them for
//                                  indices in that range and zero rows for the others, so
//                                  exactly one rank contributes each row to the sum
//   R        R        -> R
//   P(op)    R        -> P(op)     op in {sum, avg}: the lookup is linear in the weight
// Indices are never Partial. Backward is a DTensor op of its own over embedding_backward:
// grad S(k), indices S(k) -> grad_weight P(sum) (each rank scatters its own positions);
// grad S(-1), indices R -> S(1); R, R -> R; grad P(op), indices R -> P(op). A row-wise
// weight gets its gradient Replicate and keeps its own rows (a local slice, no traffic).
#pragma once

#include "dtensor/dtensor.h"

namespace dtr {

// Rows of weight [V, D] (floating) at indices (int32 or int64, any shape, each in [0, V):
// IndexError otherwise): indices.shape + [D]. torch.nn.functional.embedding(indices, weight),
// with the kernel's argument order (kernels/embedding.h).
DTensor embedding(const DTensor& weight, const DTensor& indices);

}  // namespace dtr
