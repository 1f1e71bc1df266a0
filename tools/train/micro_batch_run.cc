#include "tools/train/micro_batch_run.h"

#include <utility>

#include "core/trace.h"
#include "dtensor/autograd.h"
#include "dtensor/node_lists.h"
#include "dtensor/placement.h"

namespace dtr::train {
namespace {

// The trace category of loading a batch.
const trace::Category kDataCategory = trace::define_category("data");

// Clears the batch window when a batch's micro-batches end, by an exception too.
struct WindowReset {
  WindowReset() = default;
  WindowReset(const WindowReset&) = delete;
  WindowReset& operator=(const WindowReset&) = delete;
  ~WindowReset() { set_batch_window({}); }
};

}  // namespace

TreePlan tree_plan(const TrainConfig& c, const DeviceMesh& mesh) {
  TreePlan p;
  p.data_ranks = mesh.size() / c.tp;
  p.rank_major = rank_major_micro_batches(c, p.data_ranks);
  p.node_lists = rank_shares_are_node_lists(c, p.data_ranks);
  p.tree = c.deterministic && (micro_batches(c, p.data_ranks).size() > 1 || p.rank_major);
  p.share = c.batch_size / p.data_ranks;
  p.blocks = c.batch_size;
  return p;
}

void for_each_micro_batch(const TrainConfig& c, const TreePlan& plan, const std::vector<uint16_t>& stream,
                          const WindowOrder& order, int64_t first, const DeviceMesh& mesh,
                          const std::function<void(const MicroBatchRun&)>& body) {
  const std::vector<MicroBatch> micros = micro_batches(c, plan.data_ranks);
  const int64_t rank_stride = plan.rank_major ? plan.share : 0;
  const WindowReset reset;
  for (size_t i = 0; i < micros.size(); ++i) {
    const MicroBatch& micro = micros[i];
    MicroBatchRun run{.index = static_cast<int64_t>(i), .count = static_cast<int64_t>(micros.size())};
    {
      const trace::Span span("batch", kDataCategory);
      run.batch = make_batch(stream, order, first + micro.first, micro.rows, c.seq_len, mesh, rank_stride);
    }
    if (plan.tree) {
      // Every target of train's windows counts (none is ignore_index): the loss's mean divides
      // by the whole batch's, so the micro-batches' losses are its terms.
      BatchWindow w{.first = micro.first,
                    .count = micro.rows,
                    .total = c.batch_size,
                    .targets = c.batch_size * c.seq_len,
                    .rank_stride = rank_stride,
                    .rank_rows = micro.rows / plan.data_ranks,
                    .node_lists = plan.node_lists};
      w.rank_first = w.row(run.batch.tokens.spec().local_chunk().offset[0]);
      set_batch_window(w);
      run.node = plan.rank_major ? w.rank_node() : node_of(micro.first, micro.rows);
    }
    body(run);
  }
}

DTensor rank_sum(TreeSum<DTensor>& sum, const TreePlan& plan) {
  if (!plan.node_lists) return sum.finish();
  std::vector<NodeTerm> nodes;
  for (auto& [node, value] : sum.take_nodes()) nodes.push_back({node, {std::move(value)}});
  const Placements replicated[] = {reduced_placements(nodes.front().values.front().placements())};
  return reduce_node_lists(nodes, plan.share, plan.blocks, replicated).front();
}

LossSum::LossSum(const TreePlan& plan)
    : plan_(plan), tree_([](float& left, const float& right) { left += right; }), ranks_(add_unreduced) {}

void LossSum::add(const DTensor& loss, const MicroBatchRun& run) {
  if (!plan_.tree) {
    sum_ += loss.item();
  } else if (plan_.rank_major) {
    ranks_.push(loss.detach(), run.node);
  } else {
    tree_.push(static_cast<float>(loss.item()), run.node);
  }
}

double LossSum::finish() {
  if (!plan_.tree) return sum_;
  if (plan_.rank_major) return static_cast<float>(rank_sum(ranks_, plan_).item());
  return tree_.finish();
}

}  // namespace dtr::train
