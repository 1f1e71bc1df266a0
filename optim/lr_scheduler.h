// Learning-rate schedules with PyTorch's values at every step (torch.optim.lr_scheduler):
// each sets every group's lr to base_lr * factor(epoch), where base_lr is the group's lr
// when the scheduler was made. Making one applies epoch 0; step() moves to the next.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "optim/optimizer.h"

namespace dtr::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  void step();
  int64_t last_epoch() const { return epoch_; }
  // Every group's lr now (get_last_lr()).
  std::vector<double> last_lr() const;
  // The lr of group g at `epoch` (what step() sets).
  virtual double lr_at(int64_t epoch, size_t group) const = 0;

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Sets the groups' lr for epoch_ (called by the constructors of the final classes).
  void apply();

  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t epoch_ = 0;
};

// base_lr * factor(epoch).
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> factor);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  std::function<double(int64_t)> factor_;
};

// base_lr * gamma^floor(epoch / step_size).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// base_lr * (start + (end - start) * min(epoch, total_iters) / total_iters).
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  double start_, end_;
  int64_t total_;
};

// eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// What WarmupDecayLR does after its warm-up.
enum class LRDecay : uint8_t {
  kCosine,    // a half cosine from base_lr down to base_lr * min_ratio
  kLinear,    // a straight line from base_lr down to base_lr * min_ratio
  kConstant,  // base_lr to the end (min_ratio unused)
};

// Linear warm-up, then a decay (torchtitan's schedule, nanoGPT's get_lr): base_lr * factor
// (PyTorch's LambdaLR with this factor). For epoch e, warm-up w and total T:
//   e < w    factor (e + 1) / (w + 1)
//   e >= w   with progress p = min(1, (e - w) / max(1, T - w)):
//            kCosine    min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(pi * p))
//            kLinear    min_ratio + (1 - min_ratio) * (1 - p)
//            kConstant  1
// T <= w is legal: the run's T epochs are all warm-up (T = w = 4: 0.2, 0.4, 0.6, 0.8, never
// 1), and past them the decay spans one epoch.
class WarmupDecayLR : public LRScheduler {
 public:
  WarmupDecayLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, LRDecay decay, double min_ratio = 0.0);
  double lr_at(int64_t epoch, size_t group) const override;
  // base_lr's factor at `epoch`.
  double factor_at(int64_t epoch) const;

 private:
  int64_t warmup_, total_;
  LRDecay decay_;
  double min_ratio_;
};

// WarmupDecayLR with LRDecay::kCosine (torchtitan's default).
class WarmupCosineLR : public WarmupDecayLR {
 public:
  WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_ratio = 0.0)
      : WarmupDecayLR(optimizer, warmup_steps, total_steps, LRDecay::kCosine, min_ratio) {}
};

// schedulers[i] runs from milestones[i - 1] (0 for the first) with its epoch counted from
// there (torch's SequentialLR); milestones are increasing, one fewer than schedulers.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace dtr::optim
