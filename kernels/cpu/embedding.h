// CPU kernels of embedding and embedding_backward (kernels/embedding.h). The caller has
// checked shapes and dtypes and allocated the contiguous output, which is overwritten; the
// indices are read here, and one outside [0, V) throws IndexError before anything is written.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace dtr::cpu {

// out [indices.shape..., D] = rows of weight [V, D] at indices (any shape).
void embedding(const Tensor& out, const Tensor& weight, const Tensor& indices);
// out [num_weights, D] = sums of grad [indices.shape..., D] by index; padding_idx, already
// in [0, num_weights), gets zeros.
void embedding_backward(const Tensor& out, const Tensor& grad, const Tensor& indices,
                        std::optional<int64_t> padding_idx);

}  // namespace dtr::cpu
