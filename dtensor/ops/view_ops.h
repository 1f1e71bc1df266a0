// View-like ops on DTensors: the placement follows the dims moved (PyTorch's _view_ops).
//
// Rules, per mesh dim (Replicate and every Partial pass through unchanged: no data changes):
//   op                      | Shard in -> out
//   unsqueeze(x, d)         | S(k) -> S(k + 1) for k >= d
//   squeeze(x[, d])         | S(k) -> S(k re-indexed); S(removed dim) is replicated first
//   transpose / permute     | S(k) -> S(where dim k went)
//   broadcast_to(x, shape)  | S(k) -> S(k + new leading dims) on dims not broadcast
//   view / reshape / flatten| S(k) -> S(j) when every rank's shard of x is, element for
//                           | element, its shard of the output; otherwise S(k) is
//                           | replicated first (never silently wrong)
// view/reshape: the candidate S(k) -> S(j) pairs dims that start at the same flat offset
// (equal products of the sizes before them), so a shard of the outermost factor of a
// split or merged dim can stay; it is kept only if, for every rank, the input box and the
// output box cover the same global elements (checked from the specs, no communication).
// That holds for even splits ([4, 6] S(0) -> [24] S(0) on 2 ranks) and for some uneven
// ones where PyTorch replicates; [5, 3] S(0) -> [15] on 2 ranks (rows 0:3 = elements 0:9,
// but chunk 0 of 15 is 0:8) is replicated first.
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
