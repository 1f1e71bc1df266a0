// RMS normalisation of a DTensor over its last dims, differentiable, with its sharding rule
// (PyTorch's _fused_rms_norm strategy, which is native_layer_norm's).
//
// Rules per mesh dim, with lead = x.dim() - normalized_shape.size() row dims:
//   x       weight  -> y       why it is exact
//   S(k)    R       -> S(k)    k < lead: every normalised row lies whole on one rank
//   R       R       -> R
// Sharded normalised dims are gathered, Partial inputs reduced (the op is not linear), and
// the weight is always Replicate. Under row sharding the backward's grad_weight is P(sum):
// each rank sums its own rows (docs/sharding_rules.md, "rms_norm").
#pragma once

#include <optional>

#include "dtensor/dtensor.h"

namespace dtr {

// x / sqrt(mean(x^2) + eps) * weight over the last normalized_shape.size() dims, which must
// equal normalized_shape; weight (optional) has normalized_shape and x's dtype; eps defaults
// to the machine epsilon of x's dtype. Floating dtypes. torch.nn.functional.rms_norm.
DTensor rms_norm(const DTensor& x, const Shape& normalized_shape, const std::optional<DTensor>& weight = std::nullopt,
                 std::optional<double> eps = std::nullopt);

}  // namespace dtr
