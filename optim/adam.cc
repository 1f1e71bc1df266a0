#include "optim/adam.h"

#include <array>

#include "kernels/fill.h"
#include "kernels/optimizer_step.h"

namespace dtr::optim {
namespace {

// Zeroed moments (and AMSGrad's maximum) on a parameter's first step; the maximum, or null.
Tensor* init_moments(const Tensor& param, bool amsgrad, std::array<Tensor, 3>& state) {
  const DType d = optimizer_state_dtype(param.dtype());
  for (size_t k = 0; k < (amsgrad ? 3u : 2u); ++k) {
    if (!state[k].defined()) state[k] = zeros(param.shape(), d, param.device());
  }
  return amsgrad ? &state[2] : nullptr;
}

// The update of Adam and AdamW, which differ only in their kernel (how weight decay applies).
template <class Options, class Kernel>
auto moment_update(Kernel kernel) {
  return [kernel](const ParamGroup& g, Tensor& param, const Tensor& grad, auto& state) {
    Tensor* max_exp_avg_sq = init_moments(param, g.amsgrad, state.tensors);
    kernel(param, grad, state.tensors[0], state.tensors[1], state.step,
           Options{.lr = g.lr, .beta1 = g.beta1, .beta2 = g.beta2, .eps = g.eps, .weight_decay = g.weight_decay},
           max_exp_avg_sq);
  };
}

}  // namespace

Adam::Adam(std::vector<ParamGroup> groups) : Optimizer("Adam", std::move(groups)) {}

void Adam::step() { for_each_update(moment_update<AdamOptions>(adam_step_)); }

AdamW::AdamW(std::vector<ParamGroup> groups) : Optimizer("AdamW", std::move(groups)) {}

void AdamW::step() { for_each_update(moment_update<AdamWOptions>(adamw_step_)); }

}  // namespace dtr::optim
