#include "nn/loss.h"

#include <algorithm>

#include "core/error.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/loss.h"
#include "dtensor/ops/reduce.h"
#include "dtensor/ops/softmax.h"
#include "dtensor/ops/view_ops.h"
#include "dtensor/ops/where.h"
#include "kernels/fill.h"

namespace dtr::nn {

DTensor linear_cross_entropy(const DTensor& x, const DTensor& weight, const DTensor& bias, const DTensor& target,
                             const CrossEntropyOptions& options) {
  DTR_CHECK(x.dim() >= 2 && target.dim() == x.dim() - 1 &&
                std::equal(target.shape().begin(), target.shape().end(), x.shape().begin()),
            ValueError,
            "linear_cross_entropy: input must be [*, in] and target [*] (the input's leading dims), got {} and {}",
            x.shape(), target.shape());
  const int64_t rows = x.numel() / x.size(-1);
  return dtr::linear_cross_entropy(
      reshape(x, {rows, x.size(-1)}), weight, bias.defined() ? std::optional<DTensor>(bias) : std::nullopt,
      reshape(target, {rows}), options.ignore_index, options.reduction, options.label_smoothing);
}

DTensor cross_entropy(const DTensor& logits, const DTensor& target, const CrossEntropyOptions& options) {
  DTR_CHECK(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0, ValueError,
            "cross_entropy: label_smoothing {} is not in [0, 1]", options.label_smoothing);
  DTR_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0), ValueError,
            "cross_entropy: logits must be [N, C] and target [N], got {} and {}", logits.shape(), target.shape());
  if (options.reduction != LossReduction::kNone) {
    return dtr::cross_entropy(logits, target, options.ignore_index, options.reduction, options.label_smoothing);
  }
  const int64_t classes = logits.size(1);
  const DTensor logp = log_softmax(logits, 1);
  // The target's log-probability per row, picked by comparing the class index with it.
  const DeviceMesh& mesh = logits.mesh();
  const Tensor ids = arange(0, static_cast<double>(classes), 1, kInt64, mesh.device());
  const DTensor class_ids(ids, DTensorSpec(mesh, Placements(mesh.ndim(), Replicate()), {classes}, kInt64));
  const DTensor picked = eq(unsqueeze(target, 1), unsqueeze(class_ids, 0));  // [N, C] bool
  DTensor loss = neg(sum(masked_fill(logp, logical_not(picked), 0.0), {1}));
  if (options.label_smoothing > 0.0) {
    const double e = options.label_smoothing;
    loss = add(mul(loss, 1.0 - e), mul(mean(logp, {1}), -e));
  }
  const DTensor keep = ne(target, static_cast<double>(options.ignore_index));
  loss = masked_fill(loss, logical_not(keep), 0.0);
  switch (options.reduction) {
    case LossReduction::kNone: return loss;
    case LossReduction::kSum: return sum(loss);
    case LossReduction::kMean: return div(sum(loss), sum(dtr::to(keep, logits.dtype())));
  }
  DTR_INTERNAL_ASSERT(false, "unknown reduction");
}

DTensor mse_loss(const DTensor& input, const DTensor& target, LossReduction reduction) {
  DTR_CHECK(input.shape() == target.shape(), ValueError, "mse_loss: input {} and target {} differ in shape",
            input.shape(), target.shape());
  const DTensor d = sub(input, target);
  const DTensor squared = mul(d, d);
  switch (reduction) {
    case LossReduction::kNone: return squared;
    case LossReduction::kSum: return sum(squared);
    case LossReduction::kMean: return mean(squared);
  }
  DTR_INTERNAL_ASSERT(false, "unknown reduction");
}

}  // namespace dtr::nn
