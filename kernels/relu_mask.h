// relu's saved state: a bit per element, set where its gradient passes, a 32nd of a float32
// activation's bytes (torch saves the output itself, as large as the activation).
//
// relu_mask(y): y a contiguous floating tensor (relu's output); int32 [ceil(numel / 32)],
// bit j of word w standing for element 32 w + j in row-major order, set where y is not <= 0
// (torch's threshold_backward(grad, y, 0) passes the gradient there, NaN included); the bits
// past numel are 0.
// apply_relu_mask_(grad, mask): grad contiguous, floating, numel within the mask's 32 x
// words; zeroes grad where the bit is clear, in place: relu's backward.
#pragma once

#include "core/tensor.h"

namespace dtr {

Tensor relu_mask(const Tensor& y);
Tensor& apply_relu_mask_(Tensor& grad, const Tensor& mask);

}  // namespace dtr
