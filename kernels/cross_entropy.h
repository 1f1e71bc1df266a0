// Cross-entropy of logits against class targets, fused with log_softmax, and its backward.
//
// logits [N, C], target [N] int64. With label smoothing e in [0, 1], row n contributes
//   (1 - e) * (lse_n - logits[n, target_n]) + e * mean_c (lse_n - logits[n, c])
//     = lse_n - (1 - e) * logits[n, target_n] - e * mean_c logits[n, c],
// with lse_n = log(sum_c exp(logits[n, c])) computed max-subtracted, unless target_n is
// ignore_index (then 0; e = 0 never reads the row mean). kSum adds the contributions (in
// float64, in row order, on any thread count); kMean divides by the number of rows not
// ignored (NaN if there are none, like torch). No log-probability tensor is made: the
// forward saves lse per row, and
//   grad_logits[n, c] = (exp(logits[n, c] - lse_n) - (1 - e) [c == target_n] - e / C)
//                       * grad_loss * scale
// with scale 1 (kSum) or 1 / count (kMean); ignored rows get zeros. grad_logits is new
// (it overwrites nothing). (torch.nn.functional.cross_entropy with class-index targets
// and label_smoothing.)
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dtr {

// How per-row losses become the loss (torch.nn.functional's `reduction`): their mean over the
// rows not ignored, their sum, or none (the per-row losses themselves). The fused kernels
// here reduce (kMean, kSum); nn's losses take all three.
enum class LossReduction : uint8_t { kMean, kSum, kNone };

struct CrossEntropyOutput {
  Tensor loss;       // 0-d, logits' dtype
  Tensor logsumexp;  // [N] per-row lse, float32 (float64 for float64 logits): saved for backward
};

// Targets must lie in [0, C) or equal ignore_index (IndexError otherwise); label_smoothing
// in [0, 1] and reduction kMean or kSum (ValueError otherwise).
CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                                 LossReduction reduction = LossReduction::kMean, double label_smoothing = 0.0);

// grad_loss: a one-element floating tensor (the loss's gradient); logsumexp from the forward,
// and the forward's ignore_index, reduction and label_smoothing.
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                              const Tensor& logsumexp, int64_t ignore_index = -100,
                              LossReduction reduction = LossReduction::kMean, double label_smoothing = 0.0);

}  // namespace dtr
