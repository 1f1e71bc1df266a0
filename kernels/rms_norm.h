// RMS normalisation over the last k dims of a tensor, and its backward.
//
// x is seen as rows of N = prod(normalized_shape) elements (its last k dims). Per row:
//   rstd = 1 / sqrt(sum(x^2) / N + eps),   y = x * rstd * weight   (weight: normalized_shape, optional).
// No mean is subtracted (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization").
// rstd is saved per row with shape x.shape[:-k], in float32 for float32, bfloat16 and
// float16 inputs and float64 for float64. Backward writes new tensors and never accumulates
// into the caller's: grad_x overwrites; grad_weight is a sum over all rows, added in a fixed
// order (bitwise equal on any thread count or launch), which the caller adds to any gradient
// it already holds. (torch.nn.functional.rms_norm.)
#pragma once

#include <optional>

#include "core/tensor.h"

namespace dtr {

// The eps torch.nn.functional.rms_norm uses when none is given: the machine epsilon of x's
// dtype (torch.finfo(dtype).eps), also for the 16-bit floats whose statistics are float32.
double rms_norm_default_eps(DType dtype);

struct RMSNormOutput {
  Tensor y;     // x's shape and dtype
  Tensor rstd;  // x.shape[:-k], float32 (float64 for float64 x)
};

// Normalises x over its last normalized_shape.size() dims, which must equal normalized_shape.
// eps must be finite and >= 0; none means rms_norm_default_eps(x.dtype()).
RMSNormOutput rms_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight,
                       std::optional<double> eps = std::nullopt);

struct RMSNormGrads {
  Tensor grad_x;       // x's shape and dtype
  Tensor grad_weight;  // normalized_shape, x's dtype: sum over rows of grad_y * x * rstd
};

// Gradients of rms_norm given its saved rstd (k = x.dim() - rstd.dim()). grad_weight is
// always computed (as for weight ones when the forward had none); callers keep it if needed.
RMSNormGrads rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& rstd,
                               const std::optional<Tensor>& weight);

}  // namespace dtr
