// Layer normalisation of a DTensor over its last dims, differentiable, with its sharding
// rule (PyTorch's native_layer_norm strategy).
//
// Rules per mesh dim, with lead = x.dim() - normalized_shape.size() row dims:
//   x       weight  bias  -> y       why it is exact
//   S(k)    R       R     -> S(k)    k < lead: every normalised row lies whole on one rank
//   R       R       R     -> R
// Sharded normalised dims are gathered, Partial inputs reduced (the op is not linear), and
// weight and bias are always Replicate. Under row sharding the backward's grad_weight and
// grad_bias are P(sum): each rank sums its own rows (docs/sharding_rules.md, "layer_norm").
#pragma once

#include <optional>

#include "dtensor/dtensor.h"

namespace dtr {

// (x - mean) / sqrt(var + eps) * weight + bias over the last normalized_shape.size() dims,
// which must equal normalized_shape; weight and bias (optional) have normalized_shape and
// x's dtype. Floating dtypes. torch.nn.functional.layer_norm.
DTensor layer_norm(const DTensor& x, const Shape& normalized_shape, const std::optional<DTensor>& weight = std::nullopt,
                   const std::optional<DTensor>& bias = std::nullopt, double eps = 1e-5);

}  // namespace dtr
