// CPU kernels of rms_norm and its backward (kernels/rms_norm.h). The caller has checked the
// arguments: x floating, seen as rows of n elements; weight (undefined when absent) of n
// elements in x's dtype; rstd holds one acc_t value per row (rows = rstd.numel()). Every
// output is contiguous and overwritten: y and grad_x of x's shape, grad_weight of n elements
// in x's dtype (n = grad_weight.numel()).
#pragma once

#include "core/tensor.h"

namespace dtr::cpu {

void rms_norm(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight, double eps);
void rms_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_y, const Tensor& x,
                       const Tensor& rstd, const Tensor& weight);

}  // namespace dtr::cpu
