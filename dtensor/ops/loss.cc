#include "dtensor/ops/loss.h"

#include <algorithm>
#include <array>
#include <numeric>

#include "dtensor/autograd.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/matmul.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/reduce.h"
#include "dtensor/ops/view_ops.h"
#include "dtensor/ops/where.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"

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

// `x` moved to `placements` by a strategy of its own, so that the collective is promised (and
// traced) as the op's. `what` names it ("cross_entropy (row max)").
DTensor moved(const DTensor& x, const Placements& placements, std::string_view what) {
  if (placements == x.placements()) return x;
  const DeclaredCollectives declared;
  const DTensor inputs[] = {x};
  const OpStrategy to{{placements}, {placements}};
  return apply_strategy(what, inputs, std::span(&to, 1)).inputs[0];
}

// `x` with its Partial placements reduced.
DTensor reduced(const DTensor& x, std::string_view what) { return moved(x, reduced_placements(x.placements()), what); }

// The number of targets not equal to ignore_index over the whole (sharded or replicated)
// target, made Replicate through a strategy so that its all_reduce is a promised collective;
// inside a batch window with a count of targets (kernels/block_reduce.h), that count.
int64_t count_targets(const DTensor& target, int64_t ignore_index) {
  if (const int64_t whole = batch_window().targets; whole > 0) return whole;
  const DTensor valid = make_output(ne(target.to_local(), static_cast<double>(ignore_index)), target.mesh(),
                                    target.placements(), target.shape());
  const Placements replicated(target.mesh().ndim(), Replicate());
  return static_cast<int64_t>(moved(sum(valid), replicated, "cross_entropy (count of targets)").to_local().item());
}

// Class-sharded logits (Shard(1) on some mesh dim: a column-parallel output projection's;
// PyTorch's loss_parallel): the loss composed from ops that keep the classes sharded, so no
// rank gathers the logits. The row max, the sum of exponentials and the target's logit are
// one all-reduce each (label smoothing adds one: the mean over classes); backward issues
// none and the logits' gradient stays class-sharded. With z = logits - max (a constant per
// row, detached) and L = log(sum(exp z)), a row's loss is (1 - e) (L - z_target) +
// e (L - mean(z)), zero for an ignored target.
DTensor cross_entropy_class_sharded(const DTensor& logits, const DTensor& target, int64_t ignore_index,
                                    LossReduction reduction, double label_smoothing) {
  const DeviceMesh& mesh = logits.mesh();
  // The target whole along the mesh dims that shard the classes (each rank scores every row
  // there): a small all-gather when it arrives batch-sharded on one of them.
  Placements target_placements = target.placements();
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    if (logits.placements()[d].is_shard(1)) target_placements[d] = Replicate();
  }
  const DTensor t = moved(target, target_placements, "cross_entropy (target along the classes' mesh dims)");
  const DTensor z = sub(logits, reduced(max(logits.detach(), {1}, KeepDim::kYes), "cross_entropy (row max)"));
  const DTensor log_sum = log(reduced(sum(exp(z), {1}), "cross_entropy (sum of exponentials)"));
  // This rank's class indices, laid out as the logits' classes: [1, C].
  Placements class_placements(static_cast<size_t>(mesh.ndim()), Replicate());
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    if (logits.placements()[d].is_shard(1)) class_placements[d] = Shard(1);
  }
  const DTensorSpec class_spec(mesh, class_placements, {1, logits.size(1)}, kInt64);
  const LocalChunk mine = class_spec.local_chunk();
  Tensor indices = Tensor::empty(mine.shape, kInt64, kCPU);
  for (int64_t c = 0; c < mine.shape[1]; ++c) indices.data_ptr<int64_t>()[c] = mine.offset[1] + c;
  const DTensor classes(indices.to(mesh.device()), class_spec);
  const DTensor is_target = eq(unsqueeze(t, 1), classes);
  const DTensor picked = reduced(sum(masked_fill(z, logical_not(is_target), 0.0), {1}), "cross_entropy (target logit)");
  DTensor row = sub(log_sum, picked);
  if (label_smoothing > 0.0) {
    // mean(z) as z's masked sum over every class: its gradient then comes back class-sharded
    // through the mask, as the target's does (a plain sum's would come back Replicate and be
    // gathered to add up with the others).
    const DTensor everywhere = ge(classes, 0.0);  // [1, C] true, laid out as the classes
    const DTensor smooth =
        sub(log_sum,
            div(reduced(sum(masked_fill(z, logical_not(everywhere), 0.0), {1}), "cross_entropy (sum over classes)"),
                static_cast<double>(logits.size(1))));
    row = add(mul(row, 1.0 - label_smoothing), mul(smooth, label_smoothing));
  }
  row = mul(row, to(ne(t, static_cast<double>(ignore_index)), logits.dtype()));
  const DTensor loss = sum(row);
  if (reduction == LossReduction::kSum) return loss;
  return div(loss, static_cast<double>(count_targets(t, ignore_index)));
}

// label_smoothing in [0, 1] and a reduction the fused ops make (mean or sum); `x` (named
// `what`) is named in the error.
void check_loss_options(std::string_view op, std::string_view what, const DTensor& x, LossReduction reduction,
                        double label_smoothing) {
  DTR_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError,
            "{}: label_smoothing {} is not in [0, 1] ({} {})", op, label_smoothing, what, describe(x));
  DTR_CHECK(reduction != LossReduction::kNone, ValueError,
            "{}: reduction none is not fused; legal: LossReduction::kMean or kSum (nn::cross_entropy composes none "
            "from log_softmax; {} {})",
            op, what, describe(x));
}

// linear_cross_entropy's logits per chunk: about this many bytes, in whole K blocks.
constexpr int64_t kChunkBytes = int64_t{4} << 20;

// What linear_cross_entropy's forward computes locally: the loss and, where asked for, the
// gradients of x, weight and bias for a unit loss gradient.
struct LinearCrossEntropyLocal {
  Tensor loss;
  Tensor grad_x, grad_weight, grad_bias;
};

LinearCrossEntropyLocal linear_cross_entropy_local(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                   const Tensor& target, int64_t ignore_index, double scale,
                                                   double label_smoothing, const std::array<bool, 3>& need) {
  const DType dtype = x.dtype();
  const Device device = x.device();
  const int64_t rows = x.size(0), classes = weight.size(0), dim = weight.size(1);
  // Whole K blocks of the weight gradient's product, and fours of the bias gradient's fold.
  const int64_t block = std::lcm(matmul_k_block(dtype), int64_t{4});
  const int64_t block_bytes = block * std::max<int64_t>(classes, 1) * static_cast<int64_t>(itemsize(dtype));
  const int64_t chunk = block * std::max<int64_t>(1, kChunkBytes / block_bytes);
  const Tensor weight_t = weight.t();
  // cross_entropy's backward scales a unit loss gradient so (kMean: by 1 / count).
  const Tensor grad_loss = mul(ones({}, dtype, device), scale);
  Tensor loss_sum = zeros({}, kFloat64, device);
  LinearCrossEntropyLocal r;
  Tensor grad_weight_t;  // [dim, classes]: the product x^T g, accumulated over the chunks
  if (need[0]) r.grad_x = Tensor::empty({rows, dim}, dtype, device);
  if (need[1]) grad_weight_t = zeros({dim, classes}, acc_dtype(dtype), device);
  if (need[2]) r.grad_bias = zeros({classes}, sum_acc_dtype(dtype), device);
  for (int64_t begin = 0; begin < rows; begin += chunk) {
    const int64_t n = std::min(chunk, rows - begin);
    const Tensor xc = x.narrow(0, begin, n);
    const Tensor tc = target.narrow(0, begin, n);
    const Tensor logits = bias.defined() ? matmul_bias(xc, weight_t, bias) : matmul(xc, weight_t);
    CrossEntropyOutput out = cross_entropy(logits, tc, ignore_index, LossReduction::kSum, label_smoothing);
    add_(loss_sum, out.loss.to(kFloat64));
    if (!need[0] && !need[1] && !need[2]) continue;
    const Tensor g = cross_entropy_backward(grad_loss, logits, tc, out.logsumexp, ignore_index, LossReduction::kSum,
                                            label_smoothing);
    if (need[0]) matmul_out(r.grad_x.narrow(0, begin, n), g, weight);
    if (need[1]) matmul_accumulate(grad_weight_t, xc.t(), g);
    if (need[2]) sum_rows_accumulate(r.grad_bias, g);
  }
  r.loss = loss_sum.to(dtype);
  if (need[1]) r.grad_weight = grad_weight_t.to(dtype).t();
  if (need[2]) r.grad_bias = r.grad_bias.to(dtype);
  return r;
}

// loss / count, or loss itself for a sum (count 1).
Tensor divided(Tensor loss, double count) { return count == 1.0 ? loss : div(loss, count); }

// The loss a rank's rows contribute, divided by `count` (a mean's global target count; 1 for a
// sum), and each row's logsumexp. Under --deterministic one call per sequence, each sum
// divided before kernels/block_reduce.h's tree adds them: the quotients are then the same
// leaves on every layout, whether or not count is a power of two (dividing after the ranks'
// partial sums would round by the layout).
CrossEntropyOutput cross_entropy_divided(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                         double label_smoothing, double count) {
  const int64_t block = block_rows(logits.shape(), 1, "cross_entropy");
  if (block == 0) {
    CrossEntropyOutput out = cross_entropy(logits, target, ignore_index, LossReduction::kSum, label_smoothing);
    out.loss = divided(std::move(out.loss), count);
    return out;
  }
  const DType lse = logits.dtype() == kFloat64 ? kFloat64 : kFloat32;  // the kernel's
  CrossEntropyOutput out{.logsumexp = Tensor::empty({logits.size(0)}, lse, logits.device())};
  out.loss = reduce_rows(logits.size(0), block, [&](int64_t first, int64_t n) {
    CrossEntropyOutput b = cross_entropy(logits.narrow(0, first, n), target.narrow(0, first, n), ignore_index,
                                         LossReduction::kSum, label_smoothing);
    out.logsumexp.narrow(0, first, n).copy_(b.logsumexp);
    return std::vector{divided(std::move(b.loss), count)};
  })[0];
  return out;
}

// linear_cross_entropy_local with its loss divided by `count` (as cross_entropy_divided's) and
// its gradients scaled by 1 / count; under --deterministic one call per sequence, the
// divided losses and the weight and bias gradients summed in kernels/block_reduce.h's tree.
LinearCrossEntropyLocal linear_cross_entropy_blocked(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                     const Tensor& target, int64_t ignore_index, double count,
                                                     double label_smoothing, const std::array<bool, 3>& need) {
  const double scale = 1.0 / count;
  const int64_t block = block_rows(x.shape(), 1, "linear_cross_entropy");
  if (block == 0) {
    LinearCrossEntropyLocal r =
        linear_cross_entropy_local(x, weight, bias, target, ignore_index, scale, label_smoothing, need);
    r.loss = divided(std::move(r.loss), count);
    return r;
  }
  LinearCrossEntropyLocal r;
  if (need[0]) r.grad_x = Tensor::empty(x.shape(), x.dtype(), x.device());
  std::vector<Tensor> sums = reduce_rows(x.size(0), block, [&](int64_t first, int64_t n) {
    LinearCrossEntropyLocal b = linear_cross_entropy_local(
        x.narrow(0, first, n), weight, bias, target.narrow(0, first, n), ignore_index, scale, label_smoothing, need);
    if (need[0]) r.grad_x.narrow(0, first, n).copy_(b.grad_x);
    // The weight gradient is the transpose of a [dim, classes] accumulator: the tree adds
    // that, contiguous.
    return std::vector{divided(std::move(b.loss), count), need[1] ? b.grad_weight.t() : Tensor(),
                       std::move(b.grad_bias)};
  });
  r.loss = std::move(sums[0]);
  if (need[1]) r.grad_weight = sums[1].t();
  r.grad_bias = std::move(sums[2]);
  return r;
}

}  // namespace

DTensor linear_cross_entropy(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias,
                             const DTensor& target, int64_t ignore_index, LossReduction reduction,
                             double label_smoothing) {
  DTR_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1) &&
                (!bias || (bias->dim() == 1 && bias->size(0) == weight.size(0))),
            ValueError,
            "linear_cross_entropy: input {}, weight {} and bias {} do not fit; legal: input [N, in], weight [classes, "
            "in], bias [classes]",
            describe(x), describe(weight), bias ? describe(*bias) : "none");
  DTR_CHECK(is_floating(x.dtype()) && weight.dtype() == x.dtype() && (!bias || bias->dtype() == x.dtype()), TypeError,
            "linear_cross_entropy: input {}, weight {} and bias {} must share one floating dtype", describe(x),
            describe(weight), bias ? describe(*bias) : "none");
  DTR_CHECK(target.dtype() == kInt64 && target.dim() == 1 && target.size(0) == x.size(0), ValueError,
            "linear_cross_entropy: target {} must be int64 class indices [N] for input {}", describe(target),
            describe(x));
  check_loss_options("linear_cross_entropy", "input", x, reduction, label_smoothing);
  if (!weight.spec().is_replicated() || (bias && !bias->spec().is_replicated())) {
    return cross_entropy(linear(x, weight, bias), target, ignore_index, reduction, label_smoothing);
  }
  std::vector<DTensor> inputs{x, weight, target};
  if (bias) inputs.push_back(*bias);
  // Outputs: the loss, then the gradients of x, weight and bias.
  DimStrategy rows{{Shard(0), Replicate(), Shard(0)}, {Partial(), Shard(0), Partial(), Partial()}};
  if (bias) rows.inputs.push_back(Replicate());
  const std::vector<DimStrategy> per_dim{rows, replicate_all(inputs.size(), 4)};
  AppliedStrategy s = apply_strategy("linear_cross_entropy", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  const bool mean = reduction == LossReduction::kMean;
  const double count = mean ? static_cast<double>(count_targets(s.inputs[2], ignore_index)) : 1.0;
  const bool grads = needs_grad(s.inputs);
  const std::array<bool, 3> need{grads && s.inputs[0].requires_grad(), grads && s.inputs[1].requires_grad(),
                                 grads && bias && s.inputs[3].requires_grad()};
  LinearCrossEntropyLocal local = linear_cross_entropy_blocked(
      s.inputs[0].to_local(), s.inputs[1].to_local(), bias ? s.inputs[3].to_local() : Tensor(), s.inputs[2].to_local(),
      ignore_index, count, label_smoothing, need);
  const DeviceMesh& mesh = x.mesh();
  const std::vector<Placements>& out = s.strategy.outputs;
  DTensor loss = make_output(std::move(local.loss), mesh, out[0], {});
  if (!grads) return loss;
  auto wrap = [&](Tensor& t, const Placements& placements, const Shape& shape) {
    return t.defined() ? make_output(std::move(t), mesh, placements, shape) : DTensor();
  };
  // One per input (the target's stays undefined).
  std::vector<DTensor> computed{wrap(local.grad_x, out[1], x.shape()), wrap(local.grad_weight, out[2], weight.shape()),
                                DTensor()};
  if (bias) computed.push_back(wrap(local.grad_bias, out[3], bias->shape()));
  record("linear_cross_entropy", s.inputs, std::span(&loss, 1), [computed](const std::vector<DTensor>& g) {
    std::vector<DTensor> grads(computed.size());
    for (size_t i = 0; i < computed.size(); ++i) {
      if (computed[i].defined()) grads[i] = mul(computed[i], g[0]);
    }
    return grads;
  });
  return loss;
}

DTensor cross_entropy(const DTensor& logits, const DTensor& target, int64_t ignore_index, LossReduction reduction,
                      double label_smoothing) {
  DTR_CHECK(logits.dim() == 2 && is_floating(logits.dtype()), ValueError,
            "cross_entropy: logits {} must be floating [N, C]", describe(logits));
  DTR_CHECK(target.dtype() == kInt64, TypeError, "cross_entropy: target {} must be int64 class indices",
            describe(target));
  DTR_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), ValueError,
            "cross_entropy: target {} must be [N] for logits {}", describe(target), describe(logits));
  check_loss_options("cross_entropy", "logits", logits, reduction, label_smoothing);
  const Placements& placed = logits.placements();
  if (std::any_of(placed.begin(), placed.end(), [](const Placement& p) { return p.is_shard(1); })) {
    return cross_entropy_class_sharded(logits, target, ignore_index, reduction, label_smoothing);
  }
  // Outputs: the loss and the per-row logsumexp saved for backward.
  const std::vector<DimStrategy> per_dim{{{Shard(0), Shard(0)}, {Partial(), Shard(0)}}, replicate_all(2, 2)};
  const DTensor inputs[] = {logits, target};
  AppliedStrategy s = apply_strategy("cross_entropy", inputs, expand_strategies(per_dim, logits.mesh().ndim()));
  const bool mean = reduction == LossReduction::kMean;
  const double count = mean ? static_cast<double>(count_targets(s.inputs[1], ignore_index)) : 1.0;
  CrossEntropyOutput out =
      cross_entropy_divided(s.inputs[0].to_local(), s.inputs[1].to_local(), ignore_index, label_smoothing, count);
  DTensor loss = make_output(std::move(out.loss), logits.mesh(), s.strategy.outputs[0], {});
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
