// Losses on DTensors: cross_entropy with class-index targets, differentiable in the logits,
// with its sharding rule (PyTorch's cross-entropy = log_softmax + nll_loss strategies).
//
// Rules per mesh dim for logits [N, C] and target [N]:
//   logits  target  -> loss     why it is exact
//   S(0)    S(0)    -> P(sum)   each rank adds the losses of its own rows; kMean divides them
//                               by the GLOBAL count of kept targets (one small all_reduce)
//   R       R       -> R
// Class-sharded logits (S(1) on a mesh dim: PyTorch's loss_parallel, which dtr does without
// a context manager) are never gathered: the loss is composed from ops that keep the classes
// sharded, three all-reduces of [N] (the row max, the sum of exponentials, the target's
// logit; label smoothing adds the classes' sum), none in backward, the gradient class-sharded.
// Partial logits are reduced. The count and the backward's rules: docs/sharding_rules.md,
// "loss".
#pragma once

#include <cstdint>
#include <optional>

#include "dtensor/dtensor.h"
#include "kernels/cross_entropy.h"

namespace dtr {

// The cross-entropy of logits [N, C] (floating) against int64 target [N] in [0, C) or equal
// to ignore_index: a 0-d loss, the sum or the mean over targets not ignored (NaN when there
// are none, like torch). label_smoothing e in [0, 1] scores each row against (1 - e) on its
// target plus e / C on every class (kernels/cross_entropy.h). reduction kMean or kSum
// (LossReduction::kNone is nn::cross_entropy's). torch.nn.functional.cross_entropy with
// class-index targets.
DTensor cross_entropy(const DTensor& logits, const DTensor& target, int64_t ignore_index = -100,
                      LossReduction reduction = LossReduction::kMean, double label_smoothing = 0.0);

// cross_entropy(linear(x, weight, bias), target, ...) without ever holding the [N, C]
// logits: x [N, D], weight [C, D], bias [C] (or none), target [N]. The rows go through in
// chunks (each chunk's logits made, scored, turned into their gradient and dropped), and
// since the loss is the graph's end, forward also computes the gradients of x, weight and
// bias (when grad mode is on and they require it) and keeps them; backward scales them by
// the loss's gradient. What stays between forward and backward: those gradients (x's size,
// weight's and bias's, in the product's accumulator dtype), not the logits and their
// gradient. Chunks are whole multiples of the CPU GEMM's K block (matmul_k_block), so on the
// CPU the gradients are bit for bit the composed ops' and the loss within a rounding of
// each chunk's sum (the chunk sums add in float64). Rules per mesh dim: x S(0), weight and
// bias R, target S(0) -> loss P(sum) (kMean over the global count of targets, as
// cross_entropy) and R everywhere -> R. A weight or bias that is not Replicate on every mesh
// dim (a class-sharded, column-parallel projection: loss parallel) runs the composed ops,
// which keep the classes sharded.
DTensor linear_cross_entropy(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias,
                             const DTensor& target, int64_t ignore_index = -100,
                             LossReduction reduction = LossReduction::kMean, double label_smoothing = 0.0);

}  // namespace dtr
