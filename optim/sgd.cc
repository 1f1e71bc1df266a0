#include "optim/sgd.h"

#include "core/error.h"
#include "kernels/optimizer_step.h"

namespace dtr::optim {

SGD::SGD(std::vector<ParamGroup> groups) : Optimizer("SGD", std::move(groups)) {
  for (const ParamGroup& g : groups_) {
    DTR_CHECK(!g.nesterov || (g.momentum > 0 && g.dampening == 0), ValueError,
              "SGD: nesterov needs momentum > 0 and dampening 0 (got momentum {}, dampening {})", g.momentum,
              g.dampening);
  }
}

void SGD::step() {
  for_each_update(
      [](const ParamGroup& g, const Tensor& param, State& state) {
        if (g.momentum != 0 && !state.tensors[0].defined()) {
          state.tensors[0] = Tensor::empty(param.shape(), optimizer_state_dtype(param.dtype()), param.device());
        }
      },
      [](const ParamGroup& g, std::span<const StepTensors> tensors, int64_t step) {
        sgd_step_(tensors, step,
                  {.lr = g.lr,
                   .momentum = g.momentum,
                   .dampening = g.dampening,
                   .weight_decay = g.weight_decay,
                   .nesterov = g.nesterov});
      });
}

}  // namespace dtr::optim
