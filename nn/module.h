// Module: the base of every layer (PyTorch's torch.nn.Module). A module owns named
// parameters, buffers and child modules, in registration order; traversals give PyTorch's
// dotted names and order ("layers.0.attn.in_proj_weight"), so state dicts match those of
// the same model written in PyTorch.
//
// Calling a module runs its forward pre-hooks (which may replace the inputs), forward,
// then its forward hooks (which may replace the outputs). Backward pre-hooks run once per
// backward, when the first gradient of an output of the module's last call arrives;
// post-backward hooks run once every parameter under the module that requires a gradient
// has accumulated it. fully_shard is built from these hooks alone.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/dtensor.h"

namespace dtr::nn {

// What a module takes and returns: hooks see, and may replace, these.
using Values = std::vector<DTensor>;
// The index of the first of `values` that is the same tensor as values[i] (one tensor given
// as several values, as self-attention's query, key and value): i when none before it is, or
// when values[i] is undefined. What moves, casts or saves values keeps such a tensor one.
size_t first_same(const Values& values, size_t i);
// Parameters and persistent buffers by dotted name, in traversal order.
using StateDict = std::vector<std::pair<std::string, DTensor>>;

enum class Strict : uint8_t { kNo, kYes };
enum class Persistent : uint8_t { kNo, kYes };
enum class RemoveDuplicate : uint8_t { kNo, kYes };
// Whether a forward hook runs before those registered earlier (PyTorch's prepend=True).
enum class Prepend : uint8_t { kNo, kYes };
// What a hook does to the module's call: changes it (a parallel policy, a tensor-parallel
// style), or only watches it (CommDebugMode: returns nothing, moves nothing the model reads).
enum class HookRole : uint8_t { kActs, kObserves };

// What load_state_dict found (with Strict::kNo it loads what matches and reports the rest).
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

// The base of what a parallel policy attaches to a module.
class ParallelPolicy {
 public:
  virtual ~ParallelPolicy() = default;
};

class Module {
 public:
  using ForwardPreHook = std::function<std::optional<Values>(Module&, const Values& inputs)>;
  using ForwardHook = std::function<std::optional<Values>(Module&, const Values& inputs, const Values& outputs)>;
  using BackwardHook = std::function<void(Module&)>;

  // type_name is what repr() prints ("Linear").
  explicit Module(std::string type_name);
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // Registration. Names are non-empty, contain no '.', and are unique within the module
  // across parameters, buffers and children (ValueError naming the module and the name).
  // A parameter becomes a leaf that requires grad; an undefined DTensor registers an
  // absent one (PyTorch's None: bias=False), left out of traversals and state dicts.
  DTensor& register_parameter(const std::string& name, DTensor value);
  DTensor& register_buffer(const std::string& name, DTensor value, Persistent persistent = Persistent::kYes);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // Traversals (recursive, this module's own entries first, then each child's in order).
  // The pointers stay valid as long as the module lives; fully_shard swaps values in them.
  // A parameter shared by several modules (tied weights) is listed once, under its first
  // name, unless RemoveDuplicate::kNo (then every slot holding it is).
  std::vector<std::pair<std::string, DTensor*>> named_parameters(
      RemoveDuplicate remove_duplicate = RemoveDuplicate::kYes);
  std::vector<DTensor*> parameters();
  std::vector<std::pair<std::string, DTensor*>> named_buffers();
  // Every module under this one, itself first as "", in depth-first registration order.
  std::vector<std::pair<std::string, Module*>> named_modules();
  std::vector<std::pair<std::string, Module*>> named_children();
  // An own parameter or child by name; ValueError naming the module and what it holds.
  DTensor& parameter(const std::string& name);
  Module& child(const std::string& name);

  // Train/eval mode, for this module and every child (Dropout reads it).
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }
  // fn(m) for every child module, recursively, then for this one (PyTorch's apply).
  void apply(const std::function<void(Module&)>& fn);
  // Converts every floating parameter and buffer to `dtype` (parameters stay leaves).
  void to(DType dtype);
  // Drops every parameter's gradient (set_to_none).
  void zero_grad();
  // Elements of every parameter (global sizes).
  int64_t num_parameters();

  // PyTorch's module repr: "Linear(in_features=4, out_features=8, bias=True)", nested with
  // children's names, plus parameter shapes and counts.
  std::string repr();
  // The options part of repr ("in_features=4, out_features=8, bias=True").
  virtual std::string extra_repr() const { return ""; }

  // Parameters and persistent buffers (DTensors, as placed).
  StateDict state_dict();
  // Copies values in: each must have its entry's global shape and dtype (it is
  // redistributed to the entry's placements); tied entries stay tied. Strict::kYes: one
  // ValueError listing every missing and unexpected key and every shape or dtype mismatch,
  // before anything changes.
  LoadResult load_state_dict(const StateDict& state, Strict strict = Strict::kYes);

  // Runs the hooks around forward.
  Values operator()(Values inputs);

  // The state a parallel policy keeps with the module (fully_shard's FSDPModule,
  // replicate's DDPModule); one policy per module.
  std::shared_ptr<ParallelPolicy>& policy_state() { return policy_state_; }

  // Runs forward through `runner` from now on: operator() calls runner(inputs, forward)
  // between the forward pre-hooks and the forward hooks instead of forward(inputs)
  // (activation checkpointing, nn/checkpoint.h). One per module: ValueError for a second.
  using ForwardRunner =
      std::function<Values(const Values& inputs, const std::function<Values(const Values&)>& forward)>;
  void set_forward_runner(ForwardRunner runner);
  // Whether calling the module does more than run forward: a hook that acts (HookRole) or a
  // runner is set (a parallel policy, a tensor-parallel style, checkpointing). A caller that
  // reads the module's parameters itself instead of calling it (Transformer's fused loss)
  // checks this; hooks that only observe do not count.
  bool has_hooks() const { return acting_hooks_ > 0 || forward_runner_; }

  // Hooks, run in registration order (one with Prepend::kYes before the others).
  void register_forward_pre_hook(ForwardPreHook hook, Prepend prepend = Prepend::kNo, HookRole role = HookRole::kActs);
  void register_forward_hook(ForwardHook hook, Prepend prepend = Prepend::kNo, HookRole role = HookRole::kActs);
  void register_backward_pre_hook(BackwardHook hook, Prepend prepend = Prepend::kNo, HookRole role = HookRole::kActs);
  void register_post_backward_hook(BackwardHook hook);

 protected:
  virtual Values forward(const Values& inputs) = 0;

 private:
  struct Slot {
    std::string name;
    DTensor value;
    bool is_parameter;
    bool persistent;
  };
  // Post-backward bookkeeping: parameters still to accumulate in this backward.
  struct BackwardState;

  void check_new_name(const std::string& name) const;
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  std::string repr_lines(int indent);
  void arm_post_backward_hooks();

  std::string type_name_;
  bool training_ = true;
  std::deque<Slot> slots_;  // a deque: references to slots survive later registrations
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<ForwardPreHook> forward_pre_hooks_;
  std::vector<ForwardHook> forward_hooks_;
  std::vector<BackwardHook> backward_pre_hooks_;
  std::vector<BackwardHook> post_backward_hooks_;
  int64_t acting_hooks_ = 0;  // the hooks above registered with HookRole::kActs
  std::shared_ptr<ParallelPolicy> policy_state_;
  ForwardRunner forward_runner_;
  std::shared_ptr<BackwardState> backward_state_;  // hooks hold it weakly: a lifetime token too
  std::vector<DTensor> armed_;                     // the parameter objects the post-backward count-down watches
};

// A module of one tensor in and one out (layers, activations, Sequential).
class UnaryModule : public Module {
 public:
  using Module::Module;
  using Module::operator();
  DTensor operator()(const DTensor& x) { return Module::operator()(Values{x}).at(0); }

 protected:
  virtual DTensor forward(const DTensor& x) = 0;
  Values forward(const Values& inputs) override;
};

}  // namespace dtr::nn
