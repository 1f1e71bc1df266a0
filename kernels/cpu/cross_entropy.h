// CPU kernels of cross_entropy and its backward (kernels/cross_entropy.h). The caller has
// checked shapes and dtypes; targets are read here, and one outside [0, C) that is not
// ignore_index throws IndexError before anything is computed.
#pragma once

#include "kernels/cross_entropy.h"

namespace dtr::cpu {

CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                 Reduction reduction);
Tensor cross_entropy_backward(double grad_loss, const Tensor& logits, const Tensor& target, const Tensor& logsumexp,
                              int64_t ignore_index, Reduction reduction);

}  // namespace dtr::cpu
