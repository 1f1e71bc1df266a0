// Gradient clipping over every parameter, whatever their placements
// (torch.nn.utils.clip_grad_norm_ and clip_grad_value_).
#pragma once

#include <vector>

#include "dtensor/dtensor.h"

namespace dtr::optim {

enum class ErrorIfNonfinite : uint8_t { kNo, kYes };

// The norm (2 or infinity) of all gradients together, as if concatenated: the same value
// on every rank. Each rank reduces its shards locally; the partial results of parameters
// sharded on a mesh dim are then combined with ONE all_reduce per mesh dim for all of
// them (Replicate dims are not counted twice); Partial gradients are reduced first. If the
// norm exceeds max_norm, every gradient is scaled by max_norm / (norm + 1e-6). A non-finite
// norm is a ValueError with ErrorIfNonfinite::kYes. Parameters without a gradient are skipped.
// Under --deterministic (kernels/block_reduce.h) the 2-norm has the same bits for any
// sharding: each gradient's rows are summed in order, gathered (one float64 per row) and
// summed in block_reduce's tree, the gradients' sums in their order; a gradient split along
// a dim other than 0 is a NotImplementedError there.
double clip_grad_norm_(const std::vector<DTensor*>& parameters, double max_norm, double norm_type = 2.0,
                       ErrorIfNonfinite error_if_nonfinite = ErrorIfNonfinite::kNo);

// Clamps every gradient element to [-clip_value, clip_value] (no communication).
void clip_grad_value_(const std::vector<DTensor*>& parameters, double clip_value);

}  // namespace dtr::optim
