// A batch of --batch-size sequences run as its micro-batches (micro_batches: --grad-accum of
// them; under --deterministic the canonical tree's nodes that cover them, or rank-major
// shares), and its loss summed over them: what a training step and an evaluation share
// (docs/deterministic.md).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/dtensor.h"
#include "kernels/block_reduce.h"
#include "tools/train/token_data.h"
#include "tools/train/train_config.h"
#include "tools/train/train_data.h"

namespace dtr::train {

// How a batch of c.batch_size sequences runs on `mesh` (whose tensor-parallel ranks share
// their batch), and how --deterministic sums its micro-batches.
struct TreePlan {
  int64_t data_ranks = 1;   // the ranks that split the batch
  bool tree = false;        // in the canonical tree (more than one micro-batch, or rank-major ones)
  bool rank_major = false;  // each rank's share unreduced until the last (rank_major_micro_batches)
  bool node_lists = false;  // the ranks' shares reduced as lists of nodes (rank_shares_are_node_lists)
  int64_t share = 0;        // a rank's sequences of the batch
  int64_t blocks = 0;       // the batch's sequences
};
TreePlan tree_plan(const TrainConfig& c, const DeviceMesh& mesh);

// One micro-batch as it runs.
struct MicroBatchRun {
  Batch batch;
  int64_t index = 0, count = 0;  // which micro-batch of how many
  TreeNode node;                 // in the tree: where its sums join it (rank-major: this rank's share's)
};

// Runs `body` on each micro-batch of the batch of c.batch_size sequences whose first is the
// window `first` of `order` over `stream`, in order, as `plan` (tree_plan(c, mesh)) says. In
// the tree each runs inside its BatchWindow (kernels/block_reduce.h), cleared when the batch
// ends, by an exception too.
void for_each_micro_batch(const TrainConfig& c, const TreePlan& plan, const std::vector<uint16_t>& stream,
                          const WindowOrder& order, int64_t first, const DeviceMesh& mesh,
                          const std::function<void(const MicroBatchRun&)>& body);

// A rank-major sum: this rank's node, or with node lists its nodes reduced over the
// data-parallel group in the tree (reduce_node_lists), Replicate there. Collective then.
DTensor rank_sum(TreeSum<DTensor>& sum, const TreePlan& plan);

// The batch's loss from its micro-batches' losses: outside the tree their sum (each already
// the batch's share of the mean); in it their canonical tree (each micro-batch's mean divides
// by the whole batch's targets, so they are its terms), rank-major summed on each rank and
// reduced once. Collective at finish() under rank-major micro-batches.
class LossSum {
 public:
  explicit LossSum(const TreePlan& plan);
  void add(const DTensor& loss, const MicroBatchRun& run);
  double finish();

 private:
  TreePlan plan_;
  double sum_ = 0;
  TreeSum<float> tree_;     // the loss is float32: its sums are too
  TreeSum<DTensor> ranks_;  // rank-major: this rank's node, unreduced
};

}  // namespace dtr::train
