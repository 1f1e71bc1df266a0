// CPU kernels of cross_entropy and its backward (kernels/cross_entropy.h). The caller has
// checked shapes and dtypes and allocated the outputs, which are overwritten: loss (0-d, the
// logits' dtype), logsumexp ([N], acc_t of the logits' dtype) and grad (the logits' shape).
// Targets are read here, and one outside [0, C) that is not ignore_index throws IndexError
// before anything is computed. label_smoothing (checked: in [0, 1]) mixes the uniform
// target in, as kernels/cross_entropy.h says.
#pragma once

#include "kernels/cross_entropy.h"

namespace dtr::cpu {

void cross_entropy(const Tensor& loss, const Tensor& logsumexp, const Tensor& logits, const Tensor& target,
                   int64_t ignore_index, LossReduction reduction, double label_smoothing);
void cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& logsumexp,
                            double grad_loss, int64_t ignore_index, LossReduction reduction, double label_smoothing);

}  // namespace dtr::cpu
