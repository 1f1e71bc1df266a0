// The train program's learning-rate schedule (optim::WarmupDecayLR): --warmup steps of
// linear warm-up to --lr, then over the rest of --steps --lr-schedule's decay: cosine to 10%
// of --lr, linear to 0, or constant. Step s (1-based, as the step log counts) trains at the
// schedule's lr of epoch s - 1: with --steps 4 --warmup 4, 0.2, 0.4, 0.6 and 0.8 x --lr.
// A resumed run steps the schedule to its checkpoint's step first.
#pragma once

#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "tools/train/train_config.h"

namespace dtr::train {

// The schedule `config` names, on `opt` (set to epoch 0's lr).
optim::WarmupDecayLR make_lr_schedule(optim::Optimizer& opt, const TrainConfig& config);

}  // namespace dtr::train
