// Softmax and log-softmax along one dim, and their backward formulas.
//
// y = exp(x - max) / sum(exp(x - max)) along dim; log_softmax y = x - max - log(sum):
// max-subtracted, so no exp overflows. Computed in float (double for float64) and rounded
// once to x's dtype. The backward ops take the forward's output y (not x) and return a new
// grad_x:  softmax: grad_x = y * (grad_y - sum(grad_y * y));
//          log_softmax: grad_x = grad_y - exp(y) * sum(grad_y).
// Any dim; slices along the last dim of a contiguous tensor are unit-stride rows (the
// fast path). (torch.softmax, torch.log_softmax and their _backward_data.)
#pragma once

#include "core/tensor.h"

namespace dtr {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// grad_y and y: the same shape, dtype and device; y is softmax(x, dim).
Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim);
// y is log_softmax(x, dim).
Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim);

}  // namespace dtr
