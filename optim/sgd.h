// SGD (torch.optim.SGD): momentum, dampening, nesterov, L2 weight decay and maximize, one
// fused kernel pass per parameter shard.
#pragma once

#include "optim/optimizer.h"

namespace dtr::optim {

class SGD : public Optimizer {
 public:
  // nesterov needs momentum > 0 and dampening 0 (ValueError otherwise).
  explicit SGD(std::vector<ParamGroup> groups);
  void step() override;

 protected:
  std::array<std::string, 3> state_names() const override { return {"momentum_buffer", "", ""}; }
};

}  // namespace dtr::optim
