#include "dtensor/ops/loss.h"

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/reduce.h"
#include "kernels/elementwise.h"

namespace dtr {
namespace {

// grad_logits from the loss's gradient, scaled by `scale` (1 / count for kMean); rules:
// docs/sharding_rules.md, "loss". Not differentiable.
DTensor cross_entropy_backward(const DTensor& grad_loss, const DTensor& logits, const DTensor& target,
                               const DTensor& logsumexp, int64_t ignore_index, double scale, double label_smoothing) {
  std::vector<DimStrategy> per_dim{{{Replicate(), Shard(0), Shard(0), Shard(0)}, {Shard(0)}}, replicate_all(4)};
  add_linear_partials(per_dim, 4, 0);
  const DTensor inputs[] = {grad_loss, logits, target, logsumexp};
  AppliedStrategy s =
      apply_strategy("cross_entropy backward", inputs, expand_strategies(per_dim, logits.mesh().ndim()));
  Tensor local =
      cross_entropy_backward(mul(s.inputs[0].to_local(), scale), s.inputs[1].to_local(), s.inputs[2].to_local(),
                             s.inputs[3].to_local(), ignore_index, LossReduction::kSum, label_smoothing);
  return make_output(std::move(local), logits.mesh(), s.strategy.outputs[0], logits.shape());
}

// The number of targets not equal to ignore_index over the whole (sharded or replicated)
// target, made Replicate through a strategy so that its all_reduce is a promised collective.
int64_t count_targets(const DTensor& target, int64_t ignore_index) {
  DTensor valid = make_output(ne(target.to_local(), static_cast<double>(ignore_index)), target.mesh(),
                              target.placements(), target.shape());
  const DTensor counts[] = {sum(valid)};
  const Placements replicated(target.mesh().ndim(), Replicate());
  const OpStrategy everywhere{{replicated}, {replicated}};
  AppliedStrategy s = apply_strategy("cross_entropy (count of targets)", counts, std::span(&everywhere, 1));
  return static_cast<int64_t>(s.inputs[0].to_local().item());
}

}  // namespace

DTensor cross_entropy(const DTensor& logits, const DTensor& target, int64_t ignore_index, LossReduction reduction,
                      double label_smoothing) {
  DTR_CHECK(logits.dim() == 2 && is_floating(logits.dtype()), ValueError,
            "cross_entropy: logits {} must be floating [N, C]", describe(logits));
  DTR_CHECK(target.dtype() == kInt64, TypeError, "cross_entropy: target {} must be int64 class indices",
            describe(target));
  DTR_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), ValueError,
            "cross_entropy: target {} must be [N] for logits {}", describe(target), describe(logits));
  DTR_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError,
            "cross_entropy: label_smoothing {} is not in [0, 1] (logits {})", label_smoothing, describe(logits));
  DTR_CHECK(reduction != LossReduction::kNone, ValueError,
            "cross_entropy: reduction none is not fused; legal: LossReduction::kMean or kSum (nn::cross_entropy "
            "composes none from log_softmax; logits {})",
            describe(logits));
  // Outputs: the loss and the per-row logsumexp saved for backward.
  const std::vector<DimStrategy> per_dim{{{Shard(0), Shard(0)}, {Partial(), Shard(0)}}, replicate_all(2, 2)};
  const DTensor inputs[] = {logits, target};
  AppliedStrategy s = apply_strategy("cross_entropy", inputs, expand_strategies(per_dim, logits.mesh().ndim()));
  CrossEntropyOutput out =
      cross_entropy(s.inputs[0].to_local(), s.inputs[1].to_local(), ignore_index, LossReduction::kSum, label_smoothing);
  const bool mean = reduction == LossReduction::kMean;
  const double count = mean ? static_cast<double>(count_targets(s.inputs[1], ignore_index)) : 1.0;
  const Tensor local_loss = mean ? div(out.loss, count) : out.loss;
  DTensor loss = make_output(local_loss, logits.mesh(), s.strategy.outputs[0], {});
  DTensor lse = make_output(std::move(out.logsumexp), logits.mesh(), s.strategy.outputs[1], {logits.size(0)});
  record("cross_entropy", s.inputs, std::span(&loss, 1),
         [x = s.inputs[0].detach(), t = s.inputs[1].detach(), lse, ignore_index, count,
          label_smoothing](const std::vector<DTensor>& g) {
           return std::vector<DTensor>{
               cross_entropy_backward(g[0], x, t, lse, ignore_index, 1.0 / count, label_smoothing), DTensor()};
         });
  return loss;
}

}  // namespace dtr
