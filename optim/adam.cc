#include "optim/adam.h"

#include <span>

#include "kernels/fill.h"
#include "kernels/optimizer_step.h"

namespace dtr::optim {
namespace {

// Zeroed moments (and AMSGrad's maximum) on a parameter's first step.
constexpr auto init_moments = [](const ParamGroup& g, const Tensor& param, auto& state) {
  const DType d = optimizer_state_dtype(param.dtype());
  for (size_t k = 0; k < (g.amsgrad ? 3u : 2u); ++k) {
    if (!state.tensors[k].defined()) state.tensors[k] = zeros(param.shape(), d, param.device());
  }
};

// The update of Adam and AdamW, which differ only in their kernel (how weight decay applies).
template <class Options>
auto moment_update(void (*kernel)(std::span<const StepTensors>, int64_t, const Options&)) {
  return [kernel](const ParamGroup& g, std::span<const StepTensors> tensors, int64_t step) {
    kernel(tensors, step,
           Options{.lr = g.lr, .beta1 = g.beta1, .beta2 = g.beta2, .eps = g.eps, .weight_decay = g.weight_decay});
  };
}

}  // namespace

Adam::Adam(std::vector<ParamGroup> groups) : Optimizer("Adam", std::move(groups)) {}

void Adam::step() { for_each_update(init_moments, moment_update<AdamOptions>(adam_step_)); }

AdamW::AdamW(std::vector<ParamGroup> groups) : Optimizer("AdamW", std::move(groups)) {}

void AdamW::step() { for_each_update(init_moments, moment_update<AdamWOptions>(adamw_step_)); }

}  // namespace dtr::optim
