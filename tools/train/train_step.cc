#include "tools/train/train_step.h"

#include <algorithm>
#include <bit>
#include <optional>

#include "core/allocator.h"
#include "core/trace.h"
#include "dtensor/autograd.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/placement.h"
#include "dtensor/tree_terms.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "nn/init.h"
#include "optim/clip_grad.h"
#include "tools/train/train_data.h"
#include "tools/train/train_report.h"

namespace dtr::train {
namespace {

// The trace category of loading a batch.
const trace::Category kDataCategory = trace::define_category("data");

// `t` reduced to the placements of `laid` (a parameter's gradient): on t's mesh, or on a view
// of it with the same named dims in another order (fully_shard keeps a tensor-parallel
// parameter on the tp-first view), each dim's placement moving with its name.
DTensor reduced_as(const DTensor& t, const DTensorSpec& laid) {
  if (t.mesh() == laid.mesh()) return t.redistribute(laid.placements());
  const std::vector<std::string>& from = t.mesh().dim_names();
  const std::vector<std::string>& to = laid.mesh().dim_names();
  DTR_INTERNAL_ASSERT(std::is_permutation(from.begin(), from.end(), to.begin(), to.end()),
                      "--deterministic --grad-accum: the tied weight's parts lie on meshes {} and {}",
                      t.mesh().to_string(), laid.mesh().to_string());
  Placements moved;
  for (const std::string& name : to) {
    moved.push_back(t.placements()[static_cast<size_t>(std::find(from.begin(), from.end(), name) - from.begin())]);
  }
  return DTensor(t.to_local(), DTensorSpec(laid.mesh(), moved, t.shape(), t.dtype())).redistribute(laid.placements());
}

// This rank's rank-major sum: its node, or (node_lists) its nodes reduced over the
// data-parallel group in the tree, Replicate there; `stride` is a rank's share of the step.
DTensor rank_sum(TreeSum<DTensor>& sum, bool node_lists, int64_t stride) {
  if (!node_lists) return sum.finish();
  std::vector<TreeTerm> terms;
  for (auto& [node, value] : sum.take_nodes()) terms.push_back({node, {std::move(value)}});
  const Placements replicated[] = {reduced_placements(terms.front().values.front().placements())};
  return reduce_tree_terms(terms, stride, replicated).front();
}

// What a --deterministic step sets for its micro-batches (the batch window, the tied
// weight's parts apart), reset when the step's micro-batches end, by an exception too.
class MicroBatchScope {
 public:
  MicroBatchScope(nn::Transformer& net, bool tied) : net_(net) { net_.set_tied_gradient_apart(tied); }
  ~MicroBatchScope() {
    set_batch_window({});
    net_.set_tied_gradient_apart(false);
  }
  MicroBatchScope(const MicroBatchScope&) = delete;
  MicroBatchScope& operator=(const MicroBatchScope&) = delete;

 private:
  nn::Transformer& net_;
};

}  // namespace

StepResult train_step(Model& m, optim::Optimizer& opt, optim::LRScheduler& schedule, const TrainConfig& c,
                      const std::vector<uint16_t>& tokens, const WindowOrder& order, const DeviceMesh& mesh,
                      int64_t& window) {
  StepResult r;
  // Under --deterministic the micro-batches are nodes of the canonical tree (each a range of
  // the global batch's sequences, split over the ranks): each is reduced over the ranks at
  // once, and their gradients and losses are summed in the tree, not one after the other. A
  // tied output weight's two gradient parts are each summed so, and added at the end: one
  // step over the whole batch adds the two parts' trees, not the micro-batches' sums.
  //
  // On a number of data-parallel ranks that is not a power of two a micro-batch split over
  // them is no node. There the micro-batches are rank-major (BatchWindow): each rank holds one
  // range of the step's batch, a node, a micro-batch's share of it a node inside; fully_shard
  // and replicate sum each rank's micro-batches' gradients unreduced in the tree (sync off
  // until the last), as this sums the losses and the tied weight's output part, and the last
  // micro-batch reduces each rank's node once. A rank's share that is not one node (6
  // sequences per rank, or an hsdp shard group that is no node) stays a list of nodes, which
  // the last micro-batch reduces over the whole data-parallel group (reduce_tree_terms).
  //
  // On a power of two of ranks a micro-batch whose share per rank is not a node is split into
  // the nodes that cover it (micro_batches): 12 sequences on 2 ranks run as 8, then 4.
  const int64_t data_ranks = mesh.size() / c.tp;  // tensor-parallel ranks share their batch
  const std::vector<MicroBatch> micros = micro_batches(c, data_ranks);
  const auto count = static_cast<int64_t>(micros.size());
  const bool rank_major = rank_major_micro_batches(c, data_ranks);
  const bool node_lists = rank_shares_are_node_lists(c, data_ranks);
  const bool tree = deterministic_block_tokens() > 0 && (count > 1 || rank_major);
  const bool tied = tree && m.net->config().tie_embeddings;
  const int64_t step_first = window;
  const std::vector<DTensor*> params = m.net->parameters();
  const size_t tied_index = [&] {  // the tied weight's place in params (when it matters)
    if (!tied) return params.size();
    for (const auto& [name, p] : m.net->named_parameters()) {
      if (name == "embed.weight")
        return static_cast<size_t>(std::find(params.begin(), params.end(), p) - params.begin());
    }
    return params.size();
  }();
  DTR_INTERNAL_ASSERT(!tied || tied_index < params.size(), "--deterministic --grad-accum: no tied embed.weight");
  std::optional<MicroBatchScope> scope;
  if (tree) scope.emplace(*m.net, tied);
  TreeSum<std::vector<Tensor>> grads(add_tensors);
  TreeSum<float> losses([](float& left, const float& right) { left += right; });
  const auto add_locally = [](DTensor& left, const DTensor& right) { left = add_unreduced(left, right); };
  TreeSum<DTensor> rank_losses(add_locally), rank_tied_parts(add_locally);  // rank-major: this rank's node
  std::vector<DTensorSpec> grad_specs;
  const nn::SeedState step_seeds = nn::seed_state();
  const int64_t rank_stride = rank_major ? c.batch_size / data_ranks : 0;
  for (int64_t micro = 0; micro < count; ++micro) {
    const int64_t rows = micros[static_cast<size_t>(micro)].rows;
    const int64_t rank_rows = rows / data_ranks;  // a rank's share of the micro-batch
    m.set_gradient_sync((tree && !rank_major) || micro + 1 == count);
    // In the step's batch (rank-major: rank 0's rows).
    const int64_t first = rank_major ? micro * rank_rows : micros[static_cast<size_t>(micro)].first;
    const Batch batch = [&] {
      const trace::Span span("batch", kDataCategory);
      return make_batch(tokens, order, step_first + first, rows, c.seq_len, mesh, rank_stride);
    }();
    if (tree) {  // each micro-batch draws its dropout masks where they lie in the whole batch
      nn::set_seed_state(step_seeds);
      // Every target of train's windows counts (none is ignore_index): the loss's mean divides
      // by the whole batch's, so the micro-batches' losses are its terms.
      BatchWindow w{.first = first,
                    .count = rows,
                    .total = c.batch_size,
                    .targets = c.batch_size * c.seq_len,
                    .rank_stride = rank_stride,
                    .rank_rows = rank_rows,
                    .node_lists = node_lists};
      w.rank_first = w.row(batch.tokens.spec().local_chunk().offset[0]);
      set_batch_window(w);
    }
    window += rows;
    DTensor loss = (*m.net)(batch.tokens, batch.targets);
    if (count > 1 && !tree) loss = div(loss, static_cast<double>(count));
    loss.backward();
    if (!tree) {
      r.loss += loss.item();
      continue;
    }
    if (rank_major) {
      const TreeNode node = batch_window().rank_node();
      rank_losses.push(loss.detach(), node);
      if (tied) {
        DTensor part = m.net->take_tied_output_grad();
        DTR_INTERNAL_ASSERT(part.defined(), "--deterministic --grad-accum: the tied weight's output part is missing");
        rank_tied_parts.push(std::move(part), node);
      }
      // fully_shard leaves zeros in the leaves while sync is off: dropped, so that the synced
      // micro-batch's reduced gradients are the leaves' as they are, not added to zeros.
      if (micro + 1 < count) {
        for (DTensor* p : params) p->set_grad(DTensor());
      }
      continue;
    }
    // The micro-batch is a node of the tree (micro_batches): its sums join the tree there.
    DTR_INTERNAL_ASSERT(std::has_single_bit(static_cast<uint64_t>(rows)) && first % rows == 0,
                        "--deterministic: micro-batch [{}, {}) is no node of the canonical tree", first, first + rows);
    const TreeNode node{.level = std::countr_zero(static_cast<uint64_t>(rows)), .index = first / rows};
    losses.push(static_cast<float>(loss.item()), node);  // the loss is float32: its sums are too
    std::vector<Tensor> leaf;
    grad_specs.clear();
    for (DTensor* p : params) {
      const DTensor g = p->grad();
      DTR_INTERNAL_ASSERT(g.defined(), "--deterministic --grad-accum: a parameter got no gradient");
      leaf.push_back(g.to_local());
      grad_specs.push_back(g.spec());
      p->set_grad(DTensor());
    }
    if (tied) {  // the output layer's part, reduced over the ranks (in the tree) as the embedding's was
      const DTensor part = m.net->take_tied_output_grad();
      DTR_INTERNAL_ASSERT(part.defined(), "--deterministic --grad-accum: the tied weight's output part is missing");
      leaf.push_back(reduced_as(part, grad_specs.at(tied_index)).to_local());
    }
    grads.push(std::move(leaf), node);
  }
  scope.reset();
  if (rank_major) {  // the ranks' nodes, reduced in the tree
    r.loss = static_cast<float>(rank_sum(rank_losses, node_lists, c.batch_size / data_ranks).item());
    if (tied) {
      DTensor& weight = *params[tied_index];
      const DTensor embedding_part = weight.grad();
      const DTensor output_part =
          reduced_as(rank_sum(rank_tied_parts, node_lists, c.batch_size / data_ranks), embedding_part.spec());
      // Added in the parts' dtype (bfloat16 under --mixed-precision, as one step's slot adds
      // them), then laid out as the weight's gradient.
      const Tensor sum = add(output_part.to_local(), embedding_part.to_local().to(output_part.dtype()));
      weight.set_grad(DTensor(sum.to(embedding_part.dtype()), embedding_part.spec()));
    }
  } else if (tree) {
    r.loss = losses.finish();
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
