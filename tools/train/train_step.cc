#include "tools/train/train_step.h"

#include "core/allocator.h"
#include "core/trace.h"
#include "dtensor/ops/elementwise.h"
#include "kernels/block_reduce.h"
#include "nn/init.h"
#include "optim/clip_grad.h"
#include "tools/train/train_data.h"
#include "tools/train/train_report.h"

namespace dtr::train {
namespace {

// The trace category of loading a batch.
const trace::Category kDataCategory = trace::define_category("data");

}  // namespace

StepResult train_step(Model& m, optim::Optimizer& opt, optim::LRScheduler& schedule, const TrainConfig& c,
                      const std::vector<uint16_t>& tokens, const WindowOrder& order, const DeviceMesh& mesh,
                      int64_t& window) {
  const int64_t micro_rows = c.batch_size / c.grad_accum;
  StepResult r;
  // Under --deterministic the micro-batches are nodes of the canonical tree (each a range of
  // the global batch's sequences, split over the ranks): each is reduced over the ranks at
  // once, and their gradients and losses are summed in the tree, not one after the other.
  const bool tree = deterministic_block_tokens() > 0 && c.grad_accum > 1;
  const std::vector<DTensor*> params = m.net->parameters();
  TreeSum<std::vector<Tensor>> grads(add_tensors);
  TreeSum<float> losses([](float& left, const float& right) { left += right; });
  std::vector<DTensorSpec> grad_specs;
  const nn::SeedState step_seeds = nn::seed_state();
  for (int64_t micro = 0; micro < c.grad_accum; ++micro) {
    m.set_gradient_sync(tree || micro + 1 == c.grad_accum);
    if (tree) {  // each micro-batch draws its dropout masks where they lie in the whole batch
      nn::set_seed_state(step_seeds);
      set_batch_window({.first = micro * micro_rows, .count = micro_rows, .total = c.batch_size});
    }
    const Batch batch = [&] {
      const trace::Span span("batch", kDataCategory);
      return make_batch(tokens, order, window, micro_rows, c.seq_len, mesh);
    }();
    window += micro_rows;
    DTensor loss = (*m.net)(batch.tokens, batch.targets);
    if (c.grad_accum > 1) loss = div(loss, static_cast<double>(c.grad_accum));
    loss.backward();
    if (!tree) {
      r.loss += loss.item();
      continue;
    }
    losses.push(static_cast<float>(loss.item()));  // the loss is float32: its sums are too
    std::vector<Tensor> leaf;
    grad_specs.clear();
    for (DTensor* p : params) {
      const DTensor g = p->grad();
      DTR_INTERNAL_ASSERT(g.defined(), "--deterministic --grad-accum: a parameter got no gradient");
      leaf.push_back(g.to_local());
      grad_specs.push_back(g.spec());
      p->set_grad(DTensor());
    }
    grads.push(std::move(leaf));
  }
  if (tree) {
    set_batch_window({});
    r.loss = losses.finish();
    std::vector<Tensor> sums = grads.finish();
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
