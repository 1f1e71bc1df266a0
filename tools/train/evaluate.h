// The train program's validation loss: every --eval-every steps and at the last step, the
// mean loss over the first held-out windows in their sequential order, read in
// micro-batches of the training's size with dropout off and no graph. It reads the first
// --eval-batches x --batch-size windows, fewer when the held-out set is smaller (each window
// once, in whole micro-batches), at least one micro-batch (whose windows then repeat): the
// same windows, so the same value up to rounding, for any --grad-accum. Under --deterministic
// it reads them in whole batches of --batch-size, each run as a step runs its batch (its
// micro-batches summed in the canonical tree: tools/train/micro_batch_run.h), so the value
// has the same bits on every layout and --grad-accum.
#pragma once

#include <cstdint>

#include "dtensor/device_mesh.h"
#include "tools/train/token_data.h"
#include "tools/train/train_config.h"
#include "tools/train/train_data.h"
#include "tools/train/train_model.h"

namespace dtr::train {

// How many held-out windows each evaluation reads from `val_order`.
int64_t eval_windows(const TrainConfig& config, const WindowOrder& val_order);

// The mean loss over those windows (collective: every rank reads its rows).
double evaluate(Model& model, const TrainConfig& config, const TrainData& data, const WindowOrder& val_order,
                const DeviceMesh& mesh);

}  // namespace dtr::train
