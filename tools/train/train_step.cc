#include "tools/train/train_step.h"

#include <algorithm>

#include "core/allocator.h"
#include "dtensor/autograd.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/placement.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "nn/init.h"
#include "optim/clip_grad.h"
#include "tools/train/micro_batch_run.h"
#include "tools/train/train_data.h"
#include "tools/train/train_report.h"

namespace dtr::train {
namespace {

// `t` reduced to the placements of `laid` (a parameter's gradient): on t's mesh, or on a view
// of it with the same named dims in another order (fully_shard keeps a tensor-parallel
// parameter on the tp-first view), each dim's placement moving with its name.
DTensor reduced_as(const DTensor& t, const DTensorSpec& laid) {
  if (t.mesh() == laid.mesh()) return t.redistribute(laid.placements());
  const std::vector<std::string>& from = t.mesh().dim_names();
  const std::vector<std::string>& to = laid.mesh().dim_names();
  DTR_INTERNAL_ASSERT(std::is_permutation(from.begin(), from.end(), to.begin(), to.end()),
                      "--deterministic: the tied weight's parts lie on meshes {} and {}", t.mesh().to_string(),
                      laid.mesh().to_string());
  Placements moved;
  for (const std::string& name : to) {
    moved.push_back(t.placements()[static_cast<size_t>(std::find(from.begin(), from.end(), name) - from.begin())]);
  }
  return DTensor(t.to_local(), DTensorSpec(laid.mesh(), moved, t.shape(), t.dtype())).redistribute(laid.placements());
}

// The tied weight's parts apart (Transformer::set_tied_gradient_apart) while a step's
// micro-batches run, reset when they end, by an exception too.
class TiedApartScope {
 public:
  TiedApartScope(nn::Transformer& net, bool tied) : net_(net) { net_.set_tied_gradient_apart(tied); }
  ~TiedApartScope() { net_.set_tied_gradient_apart(false); }
  TiedApartScope(const TiedApartScope&) = delete;
  TiedApartScope& operator=(const TiedApartScope&) = delete;

 private:
  nn::Transformer& net_;
};

// The output layer's part of the tied weight's gradient from the last backward.
DTensor take_tied_part(nn::Transformer& net) {
  DTensor part = net.take_tied_output_grad();
  DTR_INTERNAL_ASSERT(part.defined(), "--deterministic: the tied weight's output part is missing");
  return part;
}

}  // namespace

StepResult train_step(Model& m, optim::Optimizer& opt, optim::LRScheduler& schedule, const TrainConfig& c,
                      const std::vector<uint16_t>& tokens, const WindowOrder& order, const DeviceMesh& mesh,
                      int64_t& window) {
  StepResult r;
  // Under --deterministic the micro-batches are nodes of the canonical tree (each a range of
  // the global batch's sequences, split over the ranks; micro_batches splits a share that is
  // no node into the nodes that cover it): each is reduced over the ranks at once, and their
  // gradients and losses are summed in the tree, not one after the other. A tied output
  // weight's two gradient parts are each summed so, and added at the end: one step over the
  // whole batch adds the two parts' trees, not the micro-batches' sums.
  //
  // On a number of data-parallel ranks that is not a power of two a micro-batch split over
  // them is no node, and under --mixed-precision the micro-batches' sums would meet in float32
  // after fully_shard's bfloat16 reduction. There the micro-batches are rank-major
  // (BatchWindow): each rank holds one range of the step's batch, a micro-
  // batch's share of it a node inside; fully_shard and replicate sum each rank's micro-batches'
  // gradients unreduced in the tree (sync off until the last), as this sums the losses and the
  // tied weight's output part, and the last micro-batch reduces each rank's node once, or its
  // list of nodes where its share is not one (reduce_node_lists).
  const TreePlan plan = tree_plan(c, mesh);
  const bool tied = plan.tree && m.net->config().tie_embeddings;
  const std::vector<DTensor*> params = m.net->parameters();
  const size_t tied_index = [&] {  // the tied weight's place in params (when it matters)
    if (!tied) return params.size();
    for (const auto& [name, p] : m.net->named_parameters()) {
      if (name == "embed.weight")
        return static_cast<size_t>(std::find(params.begin(), params.end(), p) - params.begin());
    }
    return params.size();
  }();
  DTR_INTERNAL_ASSERT(!tied || tied_index < params.size(), "--deterministic: no tied embed.weight");
  const TiedApartScope apart(*m.net, tied);
  LossSum losses(plan);
  TreeSum<std::vector<Tensor>> grads(add_tensors);
  TreeSum<DTensor> rank_tied_parts(add_unreduced);
  std::vector<DTensorSpec> grad_specs;
  const nn::SeedState step_seeds = nn::seed_state();
  for_each_micro_batch(c, plan, tokens, order, window, mesh, [&](const MicroBatchRun& run) {
    const bool last = run.index + 1 == run.count;
    m.set_gradient_sync((plan.tree && !plan.rank_major) || last);
    // Each micro-batch draws its dropout masks where they lie in the whole batch.
    if (plan.tree) nn::set_seed_state(step_seeds);
    DTensor loss = (*m.net)(run.batch.tokens, run.batch.targets);
    if (run.count > 1 && !plan.tree) loss = div(loss, static_cast<double>(run.count));
    loss.backward();
    losses.add(loss, run);
    if (!plan.tree) return;
    if (plan.rank_major) {
      if (tied) rank_tied_parts.push(take_tied_part(*m.net), run.node);
      // fully_shard leaves zeros in the leaves while sync is off: dropped, so that the synced
      // micro-batch's reduced gradients are the leaves' as they are, not added to zeros.
      if (!last) {
        for (DTensor* p : params) p->set_grad(DTensor());
      }
      return;
    }
    std::vector<Tensor> leaf;
    grad_specs.clear();
    for (DTensor* p : params) {
      const DTensor g = p->grad();
      DTR_INTERNAL_ASSERT(g.defined(), "--deterministic: a parameter got no gradient");
      leaf.push_back(g.to_local());
      grad_specs.push_back(g.spec());
      p->set_grad(DTensor());
    }
    if (tied) {  // the output layer's part, reduced over the ranks (in the tree) as the embedding's was
      leaf.push_back(reduced_as(take_tied_part(*m.net), grad_specs.at(tied_index)).to_local());
    }
    grads.push(std::move(leaf), run.node);
  });
  window += c.batch_size;
  r.loss = losses.finish();
  if (plan.rank_major && tied) {  // the output part's nodes, reduced in the tree
    DTensor& weight = *params[tied_index];
    const DTensor embedding_part = weight.grad();
    const DTensor output_part = reduced_as(rank_sum(rank_tied_parts, plan), embedding_part.spec());
    // Added in the parts' dtype (bfloat16 under --mixed-precision, as one step's slot adds
    // them), then laid out as the weight's gradient.
    const Tensor sum = add(output_part.to_local(), embedding_part.to_local().to(output_part.dtype()));
    weight.set_grad(DTensor(sum.to(embedding_part.dtype()), embedding_part.spec()));
  } else if (plan.tree && !plan.rank_major) {
    std::vector<Tensor> sums = grads.finish();
    if (tied) sums[tied_index] = add(sums.back(), sums[tied_index]);  // the output's part, then the embedding's
    for (size_t i = 0; i < params.size(); ++i) params[i]->set_grad(DTensor(std::move(sums[i]), grad_specs[i]));
  }
  r.grad_norm = optim::clip_grad_norm_(params, c.grad_clip > 0 ? c.grad_clip : INFINITY);
  if (!r.finite()) return r;
  r.lr = opt.param_groups()[0].lr;
  r.grad_bytes = gradient_bytes(m.net->parameters());
  opt.step();
  schedule.step();
  opt.zero_grad();
  return r;
}

StepAgreement agree_after_step(ProcessGroup& group, const Device& device, const RankStatus& mine) {
  const auto world = static_cast<size_t>(group.size());
  std::vector<double> shared(world + 2, 0.0);
  shared[static_cast<size_t>(group.rank())] = static_cast<double>(memory_stats(device).peak_bytes);
  shared[world] = mine.interrupted ? 1 : 0;
  shared[world + 1] = mine.writing_checkpoint ? 1 : 0;
  Tensor t = Tensor::from_vector<double>(shared).to(group.device());
  group.all_reduce(t, ReduceOp::kSum).wait();
  t = t.to(kCPU);
  const double* v = t.data_ptr<double>();
  return {
      .peak_bytes = std::vector<double>(v, v + world), .stop = v[world] > 0, .checkpoint_written = v[world + 1] == 0};
}

}  // namespace dtr::train
