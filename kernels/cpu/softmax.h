// CPU kernels of softmax, log_softmax and their backward (kernels/softmax.h). Inputs are
// floating CPU tensors of one shape and dtype, dim already wrapped; results are new and
// contiguous.
#pragma once

#include "kernels/tensor.h"

namespace dtr::cpu {

// How a softmax forward ends: divide by the sum, or subtract its log.
enum class SoftmaxKind { kSoftmax, kLogSoftmax };

Tensor softmax(const Tensor& x, int64_t dim, SoftmaxKind kind);
Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim, SoftmaxKind kind);

}  // namespace dtr::cpu
