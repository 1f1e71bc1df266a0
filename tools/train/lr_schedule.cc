#include "tools/train/lr_schedule.h"

namespace dtr::train {

optim::WarmupDecayLR make_lr_schedule(optim::Optimizer& opt, const TrainConfig& c) {
  // Cosine to 10% of --lr, linear to 0 (constant has no floor).
  const double min_ratio = c.lr_schedule == optim::LRDecay::kCosine ? 0.1 : 0.0;
  return optim::WarmupDecayLR(opt, c.warmup, c.steps, c.lr_schedule, min_ratio);
}

}  // namespace dtr::train
