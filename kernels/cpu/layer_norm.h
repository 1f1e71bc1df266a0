// CPU kernels of layer_norm and its backward (kernels/layer_norm.h). The caller has checked
// the arguments: x floating, `rows` rows of n elements, weight and bias (undefined when
// absent) of n elements in x's dtype, mean and rstd [rows] in acc_t of x's dtype. Results
// hold mean and rstd as [rows] and grad_weight, grad_bias as [n]; the caller reshapes them.
#pragma once

#include "kernels/layer_norm.h"

namespace dtr::cpu {

LayerNormOutput layer_norm(const Tensor& x, int64_t rows, int64_t n, const Tensor& weight, const Tensor& bias,
                           double eps);
LayerNormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, int64_t rows, int64_t n);

}  // namespace dtr::cpu
