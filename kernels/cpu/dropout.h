// CPU kernel of dropout and its backward (kernels/dropout.h): out = x * mask * scale, the
// product in float (double for float64). out has x's shape and dtype and is overwritten;
// x may be strided; mask is a bool tensor of x's shape.
#pragma once

#include "core/tensor.h"

namespace dtr::cpu {

void masked_scale(const Tensor& out, const Tensor& x, const Tensor& mask, double scale);

}  // namespace dtr::cpu
