// One step of the train program. The step's --grad-accum micro-batches run forward and
// backward (gradients synchronise on the last only; each loss is divided by --grad-accum, so
// the step's loss is their mean). Under --deterministic the micro-batches are nodes of the
// canonical tree or rank-major shares (micro_batches, tools/train/micro_batch_run.h), each
// micro-batch's loss is divided by the whole batch's targets, and gradients and losses are
// summed in the tree: each micro-batch reduced at once on a power of two of data-parallel
// ranks, else each rank's rank-major share summed locally and reduced once, as one node or a
// list of them (docs/deterministic.md). Then the global gradient norm is taken (and clipped
// to --grad-clip when that is > 0). Both are global reductions, the same on every rank: when
// either is not finite, every rank stops there, before the optimizer step, so no checkpoint
// can hold that state. Otherwise AdamW steps at the schedule's lr, the schedule steps and
// the gradients are zeroed. Then one small all-reduce tells every rank what the others know
// (agree_after_step): their peak memory, an interrupt, a checkpoint still being written.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "collectives/process_group.h"
#include "core/device.h"
#include "dtensor/device_mesh.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "tools/train/token_data.h"
#include "tools/train/train_config.h"
#include "tools/train/train_model.h"

namespace dtr::train {

struct StepResult {
  double loss = 0;        // the step's mean loss over its micro-batches' targets
  double grad_norm = 0;   // the global gradient norm, before clipping
  double lr = 0;          // the lr AdamW stepped at (0 when it did not step)
  double grad_bytes = 0;  // this rank's bytes of gradients before zero_grad (0 when it did not step)

  // Whether the loss and the gradient norm are finite (else no optimizer step was taken).
  bool finite() const { return std::isfinite(loss) && std::isfinite(grad_norm); }
};

// Runs one step on `tokens`, reading the windows of `order` from `window` (the data
// position), which it advances past them. Collective.
StepResult train_step(Model& model, optim::Optimizer& opt, optim::LRScheduler& schedule, const TrainConfig& config,
                      const std::vector<uint16_t>& tokens, const WindowOrder& order, const DeviceMesh& mesh,
                      int64_t& window);

// This rank's part of the agreement after a step.
struct RankStatus {
  bool interrupted = false;         // SIGINT or SIGTERM arrived
  bool writing_checkpoint = false;  // its part of the checkpoint in flight is not written yet
};

// What every rank knows after a step.
struct StepAgreement {
  std::vector<double> peak_bytes;   // every rank's peak memory on its training device, by rank
  bool stop = false;                // some rank was interrupted: every rank stops after this step
  bool checkpoint_written = false;  // every rank's part of the checkpoint in flight is written (or none is in flight)
};

// One all-reduce of world size + 2 numbers over `group` (on its device); `device` is this
// rank's training device, whose allocator's peak it reports.
StepAgreement agree_after_step(ProcessGroup& group, const Device& device, const RankStatus& mine);

}  // namespace dtr::train
