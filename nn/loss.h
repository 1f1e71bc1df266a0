// Losses with torch.nn.functional's options: cross_entropy (class-index targets;
// reduction mean | sum | none, ignore_index, label_smoothing) and mse_loss.
#pragma once

#include <cstdint>

#include "dtensor/dtensor.h"
#include "kernels/cross_entropy.h"

namespace dtr::nn {

struct CrossEntropyOptions {
  LossReduction reduction = LossReduction::kMean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;  // in [0, 1]: (1 - e) * nll + e * mean over classes of -log p
};

// logits [N, C], target int64 [N]. mean divides by the number of targets not ignored;
// none gives [N], zeros where ignored. mean and sum (label smoothing or not) run the fused
// op of dtensor/ops/loss.h (sharding rule included); none composes log_softmax.
DTensor cross_entropy(const DTensor& logits, const DTensor& target, const CrossEntropyOptions& options = {});

// cross_entropy(linear(x, weight, bias), target, options) without holding the logits: x
// [*, in], weight [classes, in], bias [classes] or undefined, target [*] (x's leading dims).
// dtensor/ops/loss.h's linear_cross_entropy (chunked rows, gradients computed in forward; a
// class-sharded weight composes the two ops). reduction mean or sum.
DTensor linear_cross_entropy(const DTensor& x, const DTensor& weight, const DTensor& bias, const DTensor& target,
                             const CrossEntropyOptions& options = {});

// (input - target)^2, reduced (mean over every element, sum, or none).
DTensor mse_loss(const DTensor& input, const DTensor& target, LossReduction reduction = LossReduction::kMean);

}  // namespace dtr::nn
