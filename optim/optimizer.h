// Optimizer: the base of SGD, Adam and AdamW (torch.optim.Optimizer), with parameter
// groups whose hyper-parameters a scheduler may change between steps.
//
// A step updates each parameter's local shard in place from its gradient's local shard
// (gradients are kept in their parameter's placements), so it issues no collective,
// whatever the placements; the state lives beside each shard, in the state dtype of
// kernels/optimizer_step.h. Parameters without a gradient are skipped, as in PyTorch.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/trace.h"
#include "dtensor/dtensor.h"
#include "kernels/elementwise.h"
#include "kernels/optimizer_step.h"

namespace dtr::optim {

// The trace category of an optimizer step's span.
inline const trace::Category kOptimizerCategory = trace::define_category("optimizer");

// One group's parameters and hyper-parameters (each optimizer reads the ones it has).
struct ParamGroup {
  std::vector<DTensor*> params = {};
  double lr = 1e-3;
  double weight_decay = 0.0;
  double momentum = 0.0;  // SGD
  double dampening = 0.0;
  bool nesterov = false;
  double beta1 = 0.9;  // Adam, AdamW
  double beta2 = 0.999;
  double eps = 1e-8;
  bool amsgrad = false;  // Adam, AdamW: divide by the running maximum of exp_avg_sq
  bool maximize = false;
  // The lr when the first scheduler was attached: every scheduler's base (PyTorch's initial_lr).
  std::optional<double> initial_lr = std::nullopt;
};

// An optimizer's state in PyTorch's layout: per parameter index (over the groups, in
// order) its step and state tensors by PyTorch's names ("momentum_buffer", "exp_avg",
// "exp_avg_sq"), as DTensors placed like the parameter; and per group its
// hyper-parameters and the indices of its parameters.
struct OptimizerState {
  struct Param {
    int64_t step = 0;
    std::map<std::string, DTensor> tensors;
  };
  struct Group {
    ParamGroup hyper;  // params left empty
    std::vector<int64_t> params;
  };
  std::map<int64_t, Param> state;  // parameters that have taken a step
  std::vector<Group> param_groups;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient.
  virtual void step() = 0;
  // Drops every gradient (set_to_none, PyTorch's default).
  void zero_grad();
  std::vector<ParamGroup>& param_groups() { return groups_; }
  // Steps taken by a parameter (by its index over the groups, PyTorch's state order).
  int64_t step_count(size_t index) const { return state_.at(index).step; }

  OptimizerState state_dict() const;
  // Takes state saved from an optimizer of the same kind over the same parameters: the
  // same groups, sizes, shapes and state names (ValueError naming the first difference).
  void load_state_dict(const OptimizerState& saved);

 protected:
  // ValueError, naming the optimizer and the group, for no parameters, a repeated one, a
  // parameter that does not require grad, or a negative lr, weight_decay, eps or momentum.
  Optimizer(std::string name, std::vector<ParamGroup> groups);

  // A parameter's state: the step count and up to three local tensors.
  struct State {
    int64_t step = 0;
    std::array<Tensor, 3> tensors;  // momentum_buffer; or exp_avg, exp_avg_sq, max_exp_avg_sq
  };
  // PyTorch's names of State::tensors ("" when unused).
  virtual std::array<std::string, 3> state_names() const = 0;

  // Counts the step of every parameter with a gradient, calls init(group, param local,
  // state) to create its state tensors, then update(group, tensors, step) once per group
  // and step count with their StepTensors (local param, local grad negated when maximize,
  // state): one multi-tensor kernel call per group.
  template <class Init, class Update>
  void for_each_update(Init&& init, Update&& update);

  std::string name_;
  std::string step_span_name_;  // "AdamW.step": the trace span of a step
  std::vector<ParamGroup> groups_;
  std::vector<State> state_;  // one per parameter, in group order
};

template <class Init, class Update>
void Optimizer::for_each_update(Init&& init, Update&& update) {
  const trace::Span span(step_span_name_, kOptimizerCategory);
  size_t index = 0;
  for (ParamGroup& group : groups_) {
    std::map<int64_t, std::vector<StepTensors>> by_step;  // parameters may differ in steps taken
    for (DTensor* p : group.params) {
      State& state = state_[index++];
      if (!p->grad().defined()) continue;
      Tensor param = p->to_local();  // a handle: the update writes the parameter's storage
      Tensor grad = p->grad().to_local().contiguous();
      if (group.maximize) grad = neg(grad);
      ++state.step;
      init(group, param, state);
      by_step[state.step].push_back({.param = param, .grad = grad, .state = state.tensors});
    }
    for (const auto& [step, tensors] : by_step) update(group, std::span<const StepTensors>(tensors), step);
  }
}

}  // namespace dtr::optim
