// View-like ops on DTensors: the placement follows the dims moved (PyTorch's _view_ops).
//
// Rules, per mesh dim (Replicate and every Partial pass through unchanged: no data changes):
//   unsqueeze(x, d)          S(k) -> S(k + 1) for k >= d
//   squeeze(x[, d])          S(k) -> S(k re-indexed); S(removed dim) is replicated first
//   transpose / permute      S(k) -> S(where dim k went)
//   broadcast_to(x, shape)   S(k) -> S(k + new leading dims) on dims not broadcast
//   view / reshape / flatten S(k) -> S(j) when every rank's shard of x is, element for
//                            element, its shard of the output; else S(k) is replicated first
// How view finds S(j), with examples: docs/sharding_rules.md, "view_ops".
#pragma once

#include <vector>

#include "dtensor/dtensor.h"

namespace dtr {

DTensor unsqueeze(const DTensor& x, int64_t dim);
// Removes dim if its size is 1 (else the same shape, as torch does); without dim, every
// size-1 dim.
DTensor squeeze(const DTensor& x, int64_t dim);
DTensor squeeze(const DTensor& x);
// Swaps two dims; Shard(dim0) becomes Shard(dim1) and back. The local is a view.
DTensor transpose(const DTensor& x, int64_t dim0, int64_t dim1);
// Output dim i is input dim dims[i].
DTensor permute(const DTensor& x, const std::vector<int64_t>& dims);
DTensor broadcast_to(const DTensor& x, const Shape& shape);
// The same elements in a new global shape (one size may be -1). view keeps the local a view
// (ValueError from the local view when its strides forbid it); reshape copies if needed.
DTensor view(const DTensor& x, const Shape& shape);
DTensor reshape(const DTensor& x, const Shape& shape);
// Dims start_dim..end_dim merged into one (a 0-d tensor becomes [1]).
DTensor flatten(const DTensor& x, int64_t start_dim = 0, int64_t end_dim = -1);

}  // namespace dtr
