// Losses on DTensors: cross_entropy with class-index targets, differentiable in the logits,
// with its sharding rule (PyTorch's cross-entropy = log_softmax + nll_loss strategies).
//
// Rules per mesh dim for logits [N, C] and target [N]:
//   logits  target  -> loss     why it is exact
//   S(0)    S(0)    -> P(sum)   each rank adds the losses of its own rows; with kMean it
//                               divides them by the GLOBAL count of targets that are not
//                               ignore_index, so the terms add up to the global mean
//   R       R       -> R
// Class-sharded logits (S(1)) are gathered (there is no loss_parallel), Partial logits are
// reduced. kMean's count is the sum of (target != ignore_index) as a DTensor (Partial(sum)
// over a sharded target) made Replicate by the op's strategy: one small int64 all_reduce
// per sharding mesh dim, counted among the promised collectives, instead of gathering the
// target. Backward is a DTensor op of its own over cross_entropy_backward: grad_loss R,
// logits, target and the saved logsumexp S(0) -> grad_logits S(0); all R -> R; grad_loss
// P(op), the rest R -> P(op) for op in {sum, avg} (grad_logits is linear in grad_loss).
#pragma once

#include <cstdint>

#include "dtensor/dtensor.h"
#include "kernels/cross_entropy.h"

namespace dtr {

// The cross-entropy of logits [N, C] (floating) against int64 target [N] in [0, C) or equal
// to ignore_index: a 0-d loss, the sum or the mean over targets not ignored (NaN when there
// are none, like torch). torch.nn.functional.cross_entropy with class-index targets.
DTensor cross_entropy(const DTensor& logits, const DTensor& target, int64_t ignore_index = -100,
                      Reduction reduction = Reduction::kMean);

}  // namespace dtr
