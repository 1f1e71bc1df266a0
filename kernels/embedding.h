// Embedding lookup, and its backward: a deterministic scatter-add.
//
// embedding(weight [V, D], indices) -> indices.shape + [D]: position p gets row
// indices[p] of weight. Indices are int32 or int64 of any shape, each in [0, V), else
// IndexError naming the index, its position and V. embedding_backward sums into row v the
// gradient rows of every position holding v, in increasing position order, so its result
// is bitwise the same on any thread count; rows of padding_idx get no gradient.
// (torch.nn.functional.embedding and aten::embedding_dense_backward.)
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace dtr {

// Rows of weight [V, D] (any dtype) gathered at indices; a new contiguous tensor.
Tensor embedding(const Tensor& weight, const Tensor& indices);

// grad [indices.shape..., D] (floating) scattered into a new [num_weights, D] tensor of
// grad's dtype, accumulated in float (double for float64). padding_idx may be negative
// (counted from the end, like torch), in [-num_weights, num_weights).
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                          std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace dtr
