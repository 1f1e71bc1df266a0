// CPU kernels of layer_norm and its backward (kernels/layer_norm.h). The caller has checked
// the arguments: x floating, seen as rows of n elements; weight and bias (undefined when
// absent) of n elements in x's dtype; mean and rstd hold one acc_t value per row (rows =
// mean.numel()). Every output is contiguous and overwritten: y and grad_x of x's shape,
// grad_weight and grad_bias of n elements in x's dtype (n = grad_weight.numel()).
#pragma once

#include "core/tensor.h"

namespace dtr::cpu {

void layer_norm(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                const Tensor& bias, double eps);
void layer_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                         const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight);

}  // namespace dtr::cpu
