#include "tools/train/lr_schedule.h"

namespace dtr::train {

optim::WarmupDecayLR make_lr_schedule(optim::Optimizer& opt, const TrainConfig& c) {
  if (c.lr_schedule == "constant") return optim::WarmupDecayLR(opt, c.warmup, c.steps, optim::LRDecay::kConstant);
  if (c.lr_schedule == "linear") return optim::WarmupDecayLR(opt, c.warmup, c.steps, optim::LRDecay::kLinear, 0.0);
  return optim::WarmupDecayLR(opt, c.warmup, c.steps, optim::LRDecay::kCosine, 0.1);
}

}  // namespace dtr::train
