// CPU kernels of kernels/relu_mask.h on checked operands: words has ceil(y.numel() / 32)
// elements, grad's numel fits the mask; both contiguous.
#pragma once

#include "core/tensor.h"

namespace dtr::cpu {

void relu_mask(const Tensor& words, const Tensor& y);
void apply_relu_mask(const Tensor& grad, const Tensor& words);

}  // namespace dtr::cpu
