// Cross-entropy of logits against class targets, fused with log_softmax, and its backward.
//
// logits [N, C], target [N] int64. Row n contributes lse_n - logits[n, target_n], with
// lse_n = log(sum_c exp(logits[n, c])) computed max-subtracted, unless target_n is
// ignore_index. kSum adds the contributions (in float64, in row order, on any thread
// count); kMean divides by the number of rows not ignored (NaN if there are none, like
// torch). No log-probability tensor is made: the forward saves lse per row, and
//   grad_logits[n, c] = (exp(logits[n, c] - lse_n) - [c == target_n]) * grad_loss * scale
// with scale 1 (kSum) or 1 / count (kMean); ignored rows get zeros. grad_logits is new
// (it overwrites nothing). (torch.nn.functional.cross_entropy with class-index targets.)
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace dtr {

// How per-row losses become one loss.
enum class Reduction { kMean, kSum };

struct CrossEntropyOutput {
  Tensor loss;       // 0-d, logits' dtype
  Tensor logsumexp;  // [N] per-row lse, float32 (float64 for float64 logits): saved for backward
};

// Targets must lie in [0, C) or equal ignore_index (IndexError otherwise).
CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                                 Reduction reduction = Reduction::kMean);

// grad_loss: a one-element floating tensor (the loss's gradient); logsumexp from the forward.
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                              const Tensor& logsumexp, int64_t ignore_index = -100,
                              Reduction reduction = Reduction::kMean);

}  // namespace dtr
