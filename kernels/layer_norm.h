// Layer normalisation over the last k dims of a tensor, and its backward.
//
// x is seen as rows of N = prod(normalized_shape) elements (its last k dims). Per row:
//   mean = sum(x) / N,  rstd = 1 / sqrt(sum((x - mean)^2) / N + eps),
//   y = (x - mean) * rstd * weight + bias   (weight, bias: normalized_shape, optional).
// mean and rstd are saved per row with shape x.shape[:-k], in float32 for float32,
// bfloat16 and float16 inputs and float64 for float64. Backward writes new tensors and
// never accumulates into the caller's: grad_x overwrites; grad_weight and grad_bias are
// sums over all rows, added in a fixed order (bitwise equal on any thread count), which
// the caller adds to any gradient it already holds. (torch.nn.functional.layer_norm.)
#pragma once

#include <optional>

#include "core/tensor.h"

namespace dtr {

struct LayerNormOutput {
  Tensor y;     // x's shape and dtype
  Tensor mean;  // x.shape[:-k], float32 (float64 for float64 x)
  Tensor rstd;  // like mean
};

// Normalises x over its last normalized_shape.size() dims, which must equal normalized_shape.
LayerNormOutput layer_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight,
                           const std::optional<Tensor>& bias, double eps = 1e-5);

struct LayerNormGrads {
  Tensor grad_x;       // x's shape and dtype
  Tensor grad_weight;  // normalized_shape, x's dtype: sum over rows of grad_y * (x - mean) * rstd
  Tensor grad_bias;    // normalized_shape, x's dtype: sum over rows of grad_y
};

// Gradients of layer_norm given its saved mean and rstd (k = x.dim() - mean.dim()). Both
// grad_weight and grad_bias are always computed (as for weight ones and bias zeros when
// the forward had none); callers keep the ones they need.
LayerNormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const std::optional<Tensor>& weight);

}  // namespace dtr
