// Adam and AdamW (torch.optim.Adam, torch.optim.AdamW): Adam's weight decay is L2 (added to
// the gradient), AdamW's decoupled (param *= 1 - lr * weight_decay); amsgrad per group; one
// fused kernel pass per parameter shard.
#pragma once

#include "optim/optimizer.h"

namespace dtr::optim {

class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<ParamGroup> groups);
  void step() override;

 protected:
  std::array<std::string, 3> state_names() const override { return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}; }
};

// Groups built with AdamW's defaults should set weight_decay (PyTorch's default is 1e-2).
class AdamW : public Optimizer {
 public:
  explicit AdamW(std::vector<ParamGroup> groups);
  void step() override;

 protected:
  std::array<std::string, 3> state_names() const override { return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}; }
};

}  // namespace dtr::optim
