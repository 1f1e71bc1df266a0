#include "nn/module.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_set>

#include "core/error.h"
#include "dtensor/autograd.h"
#include "dtensor/ops/elementwise.h"

namespace dtr::nn {

size_t first_same(const Values& values, size_t i) {
  size_t first = 0;
  while (first < i && !(values[i].defined() && values[first].is_same(values[i]))) ++first;
  return first;
}

struct Module::BackwardState {
  int64_t pending = 0;
};

Module::Module(std::string type_name)
    : type_name_(std::move(type_name)), backward_state_(std::make_shared<BackwardState>()) {}

void Module::check_new_name(const std::string& name) const {
  DTR_CHECK(!name.empty() && name.find('.') == std::string::npos, ValueError,
            "{}: the name '{}' is not legal: names are non-empty and contain no '.'", type_name_, name);
  const bool taken = std::any_of(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.name == name; }) ||
                     std::any_of(children_.begin(), children_.end(), [&](const auto& c) { return c.first == name; });
  DTR_CHECK(!taken, ValueError, "{}: '{}' is already registered (as a parameter, buffer or child module)", type_name_,
            name);
}

DTensor& Module::register_parameter(const std::string& name, DTensor value) {
  check_new_name(name);
  if (value.defined()) {
    DTR_CHECK(is_floating(value.dtype()), TypeError,
              "{}: parameter '{}' is {}; parameters must be floating (they require gradients)", type_name_, name,
              value.dtype());
    if (!value.is_leaf()) value = value.detach();
    value.requires_grad_(true);
  }
  slots_.push_back({.name = name, .value = std::move(value), .is_parameter = true, .persistent = true});
  return slots_.back().value;
}

DTensor& Module::register_buffer(const std::string& name, DTensor value, Persistent persistent) {
  check_new_name(name);
  slots_.push_back(
      {.name = name, .value = std::move(value), .is_parameter = false, .persistent = persistent == Persistent::kYes});
  return slots_.back().value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  DTR_CHECK(module != nullptr, ValueError, "{}: child module '{}' is null", type_name_, name);
  children_.emplace_back(name, std::move(module));
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out = {{"", this}};
  for (auto& [name, child] : children_) {
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(sub.empty() ? name : name + "." + sub, m);
  }
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_children() {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [name, child] : children_) out.emplace_back(name, child.get());
  return out;
}

namespace {

std::string joined(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

std::vector<std::pair<std::string, DTensor*>> Module::named_parameters(RemoveDuplicate remove_duplicate) {
  std::vector<std::pair<std::string, DTensor*>> out;
  std::unordered_set<const void*> listed;
  for (auto& [prefix, m] : named_modules()) {
    for (Slot& s : m->slots_) {
      if (!s.is_parameter || !s.value.defined()) continue;
      // A parameter shared by two modules (tied weights) is listed once, under its first name.
      const bool seen = remove_duplicate == RemoveDuplicate::kYes && !listed.insert(s.value.identity()).second;
      if (!seen) out.emplace_back(joined(prefix, s.name), &s.value);
    }
  }
  return out;
}

std::vector<DTensor*> Module::parameters() {
  std::vector<DTensor*> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, DTensor*>> Module::named_buffers() {
  std::vector<std::pair<std::string, DTensor*>> out;
  for (auto& [prefix, m] : named_modules()) {
    for (Slot& s : m->slots_) {
      if (!s.is_parameter && s.value.defined()) out.emplace_back(joined(prefix, s.name), &s.value);
    }
  }
  return out;
}

DTensor& Module::parameter(const std::string& name) {
  for (Slot& s : slots_) {
    if (s.is_parameter && s.name == name) return s.value;
  }
  std::vector<std::string> names;
  for (const Slot& s : slots_) {
    if (s.is_parameter) names.push_back(s.name);
  }
  throw ValueError(fmt::format("{}: no parameter '{}'; it has {}", type_name_, name, names));
}

Module& Module::child(const std::string& name) {
  for (auto& [n, c] : children_) {
    if (n == name) return *c;
  }
  std::vector<std::string> names;
  for (const auto& c : children_) names.push_back(c.first);
  throw ValueError(fmt::format("{}: no child module '{}'; it has {}", type_name_, name, names));
}

void Module::train(bool on) {
  apply([on](Module& m) { m.training_ = on; });
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [name, child] : children_) child->apply(fn);
  fn(*this);
}

void Module::to(DType dtype) {
  NoGradGuard no_grad;
  apply([dtype](Module& m) {
    for (Slot& s : m.slots_) {
      if (!s.value.defined() || !is_floating(s.value.dtype()) || s.value.dtype() == dtype) continue;
      DTensor converted = dtr::to(s.value, dtype);
      if (s.is_parameter) converted.requires_grad_(true);
      s.value = std::move(converted);
    }
  });
}

void Module::zero_grad() {
  for (DTensor* p : parameters()) p->set_grad(DTensor());
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (DTensor* p : parameters()) n += p->numel();
  return n;
}

std::string Module::repr_lines(int indent) {
  std::string line = type_name_ + "(" + extra_repr();
  if (children_.empty()) return line + ")";
  const std::string pad(static_cast<size_t>(indent + 2), ' ');
  line += "\n";
  for (auto& [name, child] : children_) line += pad + "(" + name + "): " + child->repr_lines(indent + 2) + "\n";
  return line + std::string(static_cast<size_t>(indent), ' ') + ")";
}

std::string Module::repr() {
  std::string out = repr_lines(0) + "\n";
  std::vector<std::string> shapes;
  for (auto& [name, p] : named_parameters()) shapes.push_back(fmt::format("{} {}", name, p->shape()));
  return out +
         fmt::format("{} parameters in {} tensors: {}\n", num_parameters(), shapes.size(), fmt::join(shapes, ", "));
}

StateDict Module::state_dict() {
  StateDict out;
  for (auto& [prefix, m] : named_modules()) {
    for (Slot& s : m->slots_) {
      if (s.value.defined() && s.persistent) out.emplace_back(joined(prefix, s.name), s.value);
    }
  }
  return out;
}

LoadResult Module::load_state_dict(const StateDict& state, Strict strict) {
  std::map<std::string, const DTensor*> by_name;
  for (const auto& [name, value] : state) by_name[name] = &value;
  // Every persistent slot under this module, by its dotted name.
  std::vector<std::pair<std::string, Slot*>> expected;
  for (auto& [prefix, m] : named_modules()) {
    for (Slot& s : m->slots_) {
      if (s.value.defined() && s.persistent) expected.emplace_back(joined(prefix, s.name), &s);
    }
  }
  // A tied slot (one tensor under several names) is not missing when the state holds another
  // of its names: PyTorch's save_model and Hugging Face's save_pretrained keep one.
  const auto tie_held = [&](const std::string& name, const Slot* slot) {
    return std::any_of(expected.begin(), expected.end(), [&](const auto& other) {
      return other.first != name && other.second->value.is_same(slot->value) && by_name.count(other.first);
    });
  };
  LoadResult result;
  std::vector<std::string> mismatches;
  for (const auto& [name, slot] : expected) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (!tie_held(name, slot)) result.missing_keys.push_back(name);
      continue;
    }
    const DTensor& v = *it->second;
    if (v.shape() != slot->value.shape() || v.dtype() != slot->value.dtype()) {
      mismatches.push_back(fmt::format("'{}': the state dict holds {}{} but the module has {}{}", name, v.dtype(),
                                       v.shape(), slot->value.dtype(), slot->value.shape()));
    } else if (!(v.mesh() == slot->value.mesh())) {
      mismatches.push_back(fmt::format("'{}': the state dict's tensor is on {} but the module's on {}", name,
                                       v.mesh().to_string(), slot->value.mesh().to_string()));
    }
  }
  for (const auto& [name, value] : by_name) {
    const bool wanted = std::any_of(expected.begin(), expected.end(), [&](const auto& e) { return e.first == name; });
    if (!wanted) result.unexpected_keys.push_back(name);
  }
  const bool strict_failure =
      strict == Strict::kYes && (!result.missing_keys.empty() || !result.unexpected_keys.empty());
  if (strict_failure || !mismatches.empty()) {
    std::string message = fmt::format("{}.load_state_dict: ", type_name_);
    if (strict == Strict::kYes && !result.missing_keys.empty()) {
      message += fmt::format("missing keys: {}; ", list_summary(result.missing_keys));
    }
    if (strict == Strict::kYes && !result.unexpected_keys.empty()) {
      message += fmt::format("unexpected keys: {}; ", list_summary(result.unexpected_keys));
    }
    if (!mismatches.empty()) message += fmt::format("mismatches: {}; ", list_summary(mismatches, 3));
    throw ValueError(message + "nothing was loaded");
  }
  NoGradGuard no_grad;
  // Slots that share one tensor (tied weights) keep sharing the new one, loaded from the
  // first of their names that the state dict holds, whichever slot comes first.
  std::vector<DTensor> before;
  for (const auto& entry : expected) before.push_back(entry.second->value);
  std::vector<std::optional<size_t>> source(expected.size());  // the slot whose name loads slot i
  for (size_t i = 0; i < expected.size(); ++i) {
    for (size_t j = 0; j < expected.size() && !source[i]; ++j) {
      if (before[j].is_same(before[i]) && by_name.count(expected[j].first)) source[i] = j;
    }
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (source[i] != i) continue;
    Slot* slot = expected[i].second;
    DTensor value = by_name.at(expected[i].first)->redistribute(slot->value.placements()).detach();
    if (slot->is_parameter) value.requires_grad_(true);
    slot->value = std::move(value);
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (source[i] && *source[i] != i) expected[i].second->value = expected[*source[i]].second->value;
  }
  return result;
}

Values Module::operator()(Values inputs) {
  // Armed before the pre-hooks, which may swap parameters for the call (fully_shard).
  if (!post_backward_hooks_.empty()) arm_post_backward_hooks();
  for (const ForwardPreHook& hook : forward_pre_hooks_) {
    if (std::optional<Values> replaced = hook(*this, inputs)) inputs = std::move(*replaced);
  }
  Values outputs =
      forward_runner_ ? forward_runner_(inputs, [this](const Values& in) { return forward(in); }) : forward(inputs);
  for (const ForwardHook& hook : forward_hooks_) {
    if (std::optional<Values> replaced = hook(*this, inputs, outputs)) outputs = std::move(*replaced);
  }
  if (!backward_pre_hooks_.empty() && grad_mode_enabled()) {
    // The first output gradient of this call's backward runs the hooks, once.
    auto fired = std::make_shared<bool>(false);
    std::weak_ptr<BackwardState> alive = backward_state_;
    for (const DTensor& y : outputs) {
      if (!y.defined() || !y.requires_grad()) continue;
      y.register_hook([this, fired, alive](const DTensor&) {
        if (!*fired && !alive.expired()) {
          *fired = true;
          for (const BackwardHook& hook : backward_pre_hooks_) hook(*this);
        }
        return DTensor();
      });
    }
  }
  return outputs;
}

void Module::arm_post_backward_hooks() {
  // Counts down the parameters that require a gradient; each new parameter object (the
  // first call, or after load_state_dict or to() replaced one) gets the accumulate hook.
  int64_t pending = 0;
  const std::vector<DTensor*> current = parameters();
  std::unordered_set<const void*> armed, present;
  for (const DTensor& a : armed_) armed.insert(a.identity());
  for (DTensor* p : current) {
    present.insert(p->identity());
    if (!p->requires_grad()) continue;
    ++pending;
    if (armed.contains(p->identity())) continue;
    std::weak_ptr<BackwardState> state = backward_state_;
    p->register_post_accumulate_grad_hook([this, state](const DTensor&) {
      const std::shared_ptr<BackwardState> s = state.lock();
      if (s && s->pending > 0 && --s->pending == 0) {
        for (const BackwardHook& hook : post_backward_hooks_) hook(*this);
      }
    });
    armed_.push_back(*p);
  }
  // Forget parameters that were replaced, so the module does not keep them alive.
  std::erase_if(armed_, [&](const DTensor& a) { return !present.contains(a.identity()); });
  backward_state_->pending = pending;
}

void Module::set_forward_runner(ForwardRunner runner) {
  DTR_CHECK(!forward_runner_, ValueError, "{}: its forward already runs through another runner (checkpointed twice?)",
            type_name_);
  forward_runner_ = std::move(runner);
}

void Module::register_forward_pre_hook(ForwardPreHook hook, Prepend prepend, HookRole role) {
  if (role == HookRole::kActs) {
    ++acting_hooks_;
  } else {  // an observer changes nothing: has_hooks may then ignore it
    hook = [observe = std::move(hook)](Module& m, const Values& inputs) {
      std::optional<Values> replaced = observe(m, inputs);
      DTR_INTERNAL_ASSERT(!replaced, "{}: an observing forward pre-hook replaced the inputs", m.type_name());
      return replaced;
    };
  }
  forward_pre_hooks_.insert(prepend == Prepend::kYes ? forward_pre_hooks_.begin() : forward_pre_hooks_.end(),
                            std::move(hook));
}

void Module::register_forward_hook(ForwardHook hook, Prepend prepend, HookRole role) {
  if (role == HookRole::kActs) {
    ++acting_hooks_;
  } else {  // an observer changes nothing: has_hooks may then ignore it
    hook = [observe = std::move(hook)](Module& m, const Values& inputs, const Values& outputs) {
      std::optional<Values> replaced = observe(m, inputs, outputs);
      DTR_INTERNAL_ASSERT(!replaced, "{}: an observing forward hook replaced the outputs", m.type_name());
      return replaced;
    };
  }
  forward_hooks_.insert(prepend == Prepend::kYes ? forward_hooks_.begin() : forward_hooks_.end(), std::move(hook));
}
void Module::register_backward_pre_hook(BackwardHook hook, Prepend prepend, HookRole role) {
  backward_pre_hooks_.insert(prepend == Prepend::kYes ? backward_pre_hooks_.begin() : backward_pre_hooks_.end(),
                             std::move(hook));
  if (role == HookRole::kActs) ++acting_hooks_;
}
void Module::register_post_backward_hook(BackwardHook hook) {
  post_backward_hooks_.push_back(std::move(hook));
  ++acting_hooks_;
}

Values UnaryModule::forward(const Values& inputs) {
  DTR_CHECK(inputs.size() == 1, ValueError, "{}: takes one tensor, got {}", type_name(), inputs.size());
  return {forward(inputs[0])};
}

}  // namespace dtr::nn
