// View-like ops on DTensors: the placement follows the dims moved (PyTorch's _view_ops).
//
// unsqueeze(x, d): Shard(k) becomes Shard(k + 1) for k >= d. broadcast_to(x, shape):
// Shard stays on non-broadcast dims (re-indexed for new leading dims), Replicate and
// Partial stay (broadcasting is linear); a sharded dim cannot be broadcast (it has size 1,
// so it is never sharded in practice: ValueError otherwise).
#pragma once

#include "dtensor/dtensor.h"

namespace dtr {

DTensor unsqueeze(const DTensor& x, int64_t dim);
DTensor broadcast_to(const DTensor& x, const Shape& shape);

}  // namespace dtr
