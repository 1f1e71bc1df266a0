#include "optim/adam.h"

#include "kernels/fill.h"
#include "kernels/optimizer_step.h"

namespace dtr::optim {
namespace {

// Zeroed moments on a parameter's first step.
void init_moments(const Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq) {
  if (exp_avg.defined()) return;
  const DType d = optimizer_state_dtype(param.dtype());
  exp_avg = zeros(param.shape(), d, param.device());
  exp_avg_sq = zeros(param.shape(), d, param.device());
}

}  // namespace

Adam::Adam(std::vector<ParamGroup> groups) : Optimizer("Adam", std::move(groups)) {}

void Adam::step() {
  for_each_update([](const ParamGroup& g, Tensor& param, const Tensor& grad, State& state) {
    init_moments(param, state.first, state.second);
    adam_step_(param, grad, state.first, state.second, state.step,
               {.lr = g.lr, .beta1 = g.beta1, .beta2 = g.beta2, .eps = g.eps, .weight_decay = g.weight_decay});
  });
}

AdamW::AdamW(std::vector<ParamGroup> groups) : Optimizer("AdamW", std::move(groups)) {}

void AdamW::step() {
  for_each_update([](const ParamGroup& g, Tensor& param, const Tensor& grad, State& state) {
    init_moments(param, state.first, state.second);
    adamw_step_(param, grad, state.first, state.second, state.step,
                {.lr = g.lr, .beta1 = g.beta1, .beta2 = g.beta2, .eps = g.eps, .weight_decay = g.weight_decay});
  });
}

}  // namespace dtr::optim
