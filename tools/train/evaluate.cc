#include "tools/train/evaluate.h"

#include <algorithm>

#include "dtensor/autograd.h"

namespace dtr::train {

int64_t eval_windows(const TrainConfig& c, const WindowOrder& val_order) {
  const int64_t rows = c.batch_size / c.grad_accum;
  const int64_t available = val_order.num_windows() / rows * rows;
  return std::max(rows, std::min(c.eval_batches * c.batch_size, available));
}

double evaluate(Model& m, const TrainConfig& c, const TrainData& data, const WindowOrder& val_order,
                const DeviceMesh& mesh) {
  const NoGradGuard no_grad;
  m.net->eval();
  const int64_t rows = c.batch_size / c.grad_accum;
  const int64_t batches = eval_windows(c, val_order) / rows;
  double total = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const Batch batch = make_batch(data.val, val_order, b * rows, rows, c.seq_len, mesh);
    total += (*m.net)(batch.tokens, batch.targets).item();
  }
  m.net->train();
  return total / static_cast<double>(batches);
}

}  // namespace dtr::train
