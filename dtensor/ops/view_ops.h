// View-like ops on DTensors: the placement follows the dims moved (PyTorch's _view_ops).
//
// unsqueeze(x, d): Shard(k) becomes Shard(k + 1) for k >= d. transpose(x, a, b): Shard(a)
// and Shard(b) swap. broadcast_to(x, shape):
// Shard stays on non-broadcast dims (re-indexed for new leading dims), Replicate and
// Partial stay (broadcasting is linear); a sharded dim cannot be broadcast (it has size 1,
// so it is never sharded in practice: ValueError otherwise).
#pragma once

#include "dtensor/dtensor.h"

namespace dtr {

DTensor unsqueeze(const DTensor& x, int64_t dim);
// Swaps two dims; Shard(dim0) becomes Shard(dim1) and back. The local is a view.
DTensor transpose(const DTensor& x, int64_t dim0, int64_t dim1);
DTensor broadcast_to(const DTensor& x, const Shape& shape);

}  // namespace dtr
