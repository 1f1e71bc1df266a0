#include "optim/optimizer.h"

#include <algorithm>

#include <fmt/ranges.h>

#include "core/error.h"

namespace dtr::optim {

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups)
    : name_(std::move(name)), step_span_name_(name_ + ".step"), groups_(std::move(groups)) {
  DTR_CHECK(!groups_.empty(), ValueError, "{}: no parameter groups given", name_);
  std::vector<DTensor*> seen;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    DTR_CHECK(!group.params.empty(), ValueError, "{}: parameter group {} has no parameters", name_, g);
    DTR_CHECK(group.lr >= 0 && group.weight_decay >= 0 && group.eps >= 0 && group.momentum >= 0, ValueError,
              "{}: parameter group {}: lr {}, weight_decay {}, eps {} and momentum {} must be non-negative", name_, g,
              group.lr, group.weight_decay, group.eps, group.momentum);
    DTR_CHECK(group.beta1 >= 0 && group.beta1 < 1 && group.beta2 >= 0 && group.beta2 < 1, ValueError,
              "{}: parameter group {}: betas ({}, {}) must be in [0, 1)", name_, g, group.beta1, group.beta2);
    for (DTensor* p : group.params) {
      DTR_CHECK(p != nullptr && p->defined() && p->is_leaf() && p->requires_grad(), ValueError,
                "{}: parameter group {} holds {}, not a leaf that requires grad", name_, g,
                p != nullptr && p->defined() ? p->to_string() : "an undefined tensor");
      DTR_CHECK(std::none_of(seen.begin(), seen.end(), [&](const DTensor* q) { return q->is_same(*p); }), ValueError,
                "{}: parameter {} appears twice (a parameter belongs to one group once)", name_, p->to_string());
      seen.push_back(p);
    }
  }
  state_.resize(seen.size());
}

void Optimizer::zero_grad() {
  for (ParamGroup& group : groups_) {
    for (DTensor* p : group.params) p->set_grad(DTensor());
  }
}

namespace {

// Every parameter over the groups, in order.
std::vector<DTensor*> flat_params(const std::vector<ParamGroup>& groups) {
  std::vector<DTensor*> out;
  for (const ParamGroup& g : groups) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

}  // namespace

OptimizerState Optimizer::state_dict() const {
  OptimizerState out;
  const std::array<std::string, 3> names = state_names();
  const std::vector<DTensor*> params = flat_params(groups_);
  int64_t index = 0;
  for (const ParamGroup& g : groups_) {
    OptimizerState::Group group{g, {}};
    group.hyper.params.clear();
    for (size_t k = 0; k < g.params.size(); ++k) group.params.push_back(index++);
    out.param_groups.push_back(std::move(group));
  }
  for (size_t i = 0; i < state_.size(); ++i) {
    const State& s = state_[i];
    if (s.step == 0) continue;
    OptimizerState::Param p{s.step, {}};
    const DTensorSpec& spec = params[i]->spec();
    for (size_t k = 0; k < names.size(); ++k) {
      const Tensor& t = s.tensors[k];
      if (names[k].empty() || !t.defined()) continue;
      p.tensors.emplace(names[k], DTensor(t, DTensorSpec(spec.mesh(), spec.placements(), spec.shape(), t.dtype())));
    }
    out.state.emplace(static_cast<int64_t>(i), std::move(p));
  }
  return out;
}

void Optimizer::load_state_dict(const OptimizerState& saved) {
  DTR_CHECK(saved.param_groups.size() == groups_.size(), ValueError,
            "{}.load_state_dict: the saved state has {} parameter groups, this optimizer {}", name_,
            saved.param_groups.size(), groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    DTR_CHECK(saved.param_groups[g].params.size() == groups_[g].params.size(), ValueError,
              "{}.load_state_dict: group {} saved {} parameters, this optimizer has {}", name_, g,
              saved.param_groups[g].params.size(), groups_[g].params.size());
  }
  const std::vector<DTensor*> params = flat_params(groups_);
  const std::array<std::string, 3> names = state_names();
  std::vector<State> loaded(params.size());
  for (const auto& [index, p] : saved.state) {
    DTR_CHECK(index >= 0 && index < static_cast<int64_t>(params.size()), ValueError,
              "{}.load_state_dict: state for parameter {} but there are {}", name_, index, params.size());
    State& s = loaded[static_cast<size_t>(index)];
    s.step = p.step;
    for (const auto& [name, t] : p.tensors) {
      const auto slot = std::find(names.begin(), names.end(), name);
      DTR_CHECK(!name.empty() && slot != names.end(), ValueError,
                "{}.load_state_dict: parameter {} has state '{}'; {} keeps {}", name_, index, name, name_,
                fmt::join(names.begin(), std::find(names.begin(), names.end(), std::string()), ", "));
      DTR_CHECK(t.shape() == params[index]->shape(), ValueError,
                "{}.load_state_dict: state '{}' of parameter {} is {} but the parameter is {}", name_, name, index,
                t.shape(), params[index]->shape());
      // Beside the parameter's local, wherever the state was saved from (a run offloaded to
      // the host resumes state read onto the device, and the other way round).
      const Tensor& beside = params[index]->to_local();
      s.tensors[slot - names.begin()] =
          t.redistribute(params[index]->placements()).to_local().to(beside.device()).clone();
    }
  }
  state_ = std::move(loaded);
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<DTensor*> kept = std::move(groups_[g].params);
    groups_[g] = saved.param_groups[g].hyper;
    groups_[g].params = std::move(kept);
  }
}

}  // namespace dtr::optim
