// CPU kernels of softmax, log_softmax and their backward (kernels/softmax.h). Inputs are
// floating CPU tensors of one shape and dtype, dim already wrapped; the output is
// contiguous, of the inputs' shape and dtype, and is overwritten.
#pragma once

#include "core/tensor.h"
#include "kernels/softmax_kind.h"

namespace dtr::cpu {

void softmax(const Tensor& y, const Tensor& x, int64_t dim, SoftmaxKind kind);
void softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, int64_t dim, SoftmaxKind kind);

}  // namespace dtr::cpu
