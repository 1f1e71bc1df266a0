// CPU kernels of embedding and embedding_backward (kernels/embedding.h). The caller has
// checked shapes and dtypes; the indices are read here, and one outside [0, V) throws
// IndexError before anything is written.
#pragma once

#include <optional>

#include "kernels/tensor.h"

namespace dtr::cpu {

// weight [V, D], indices of any shape -> [indices.shape..., D].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// grad [indices.shape..., D] -> [num_weights, D]; padding_idx already in [0, num_weights).
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                          std::optional<int64_t> padding_idx);

}  // namespace dtr::cpu
