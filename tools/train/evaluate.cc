#include "tools/train/evaluate.h"

#include <algorithm>

#include "dtensor/autograd.h"
#include "tools/train/micro_batch_run.h"

namespace dtr::train {

namespace {

// What one held-out batch is: a micro-batch of training's size, or under --deterministic a
// step's whole batch in its micro-batches.
TrainConfig eval_batch(const TrainConfig& c) {
  TrainConfig batch = c;
  if (!c.deterministic) {
    batch.batch_size = c.batch_size / c.grad_accum;
    batch.grad_accum = 1;
  }
  return batch;
}

}  // namespace

int64_t eval_windows(const TrainConfig& c, const WindowOrder& val_order) {
  const int64_t rows = eval_batch(c).batch_size;
  const int64_t available = val_order.num_windows() / rows * rows;
  return std::max(rows, std::min(c.eval_batches * c.batch_size, available));
}

double evaluate(Model& m, const TrainConfig& c, const TrainData& data, const WindowOrder& val_order,
                const DeviceMesh& mesh) {
  const NoGradGuard no_grad;
  m.net->eval();
  const TrainConfig batch = eval_batch(c);
  const int64_t batches = eval_windows(c, val_order) / batch.batch_size;
  const TreePlan plan = tree_plan(batch, mesh);
  double total = 0;
  for (int64_t b = 0; b < batches; ++b) {
    LossSum loss(plan);
    for_each_micro_batch(batch, plan, data.val, val_order, b * batch.batch_size, mesh, [&](const MicroBatchRun& run) {
      loss.add((*m.net)(run.batch.tokens, run.batch.targets), run);
    });
    total += loss.finish();
  }
  m.net->train();
  return total / static_cast<double>(batches);
}

}  // namespace dtr::train
