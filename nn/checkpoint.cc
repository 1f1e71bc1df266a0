#include "nn/checkpoint.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "dtensor/autograd.h"
#include "dtensor/kept_outputs.h"
#include "kernels/fill.h"
#include "nn/init.h"

namespace dtr::nn {
namespace {

// What one checkpointed call keeps for its backward.
struct Saved {
  Values inputs;                    // detached; one tensor given as several inputs, once
  std::vector<size_t> first_of;     // per input, the first input that is the same tensor
  std::optional<KeptOutputs> kept;  // selective: the kept ops' results, until the recompute
  std::vector<bool> differentiable;
  SeedState seed;
  std::function<Values(const Values&)> forward;
  // The module's parameter slots and what they held during this call's forward (fully_shard's
  // gathered parameters of this call, for one): the recompute runs with the same tensors.
  std::vector<std::pair<DTensor*, DTensor>> params;
  bool recomputed = false;
};

// The recompute: forward again from the saved inputs with grad on and the seed state of the
// first run, then backward from the outputs that carry gradients. The inputs' gradients,
// as they arrived (no move to the inputs' placements: the ops before take them as any
// gradient). The outputs and their gradients are handed to the backward, which frees them
// as it runs: the recomputed outputs' values are the first call's, which the graph above
// already used, and the gradients are the engine's, given to this node alone.
std::vector<DTensor> recompute(Saved& saved, std::vector<DTensor> grad_outputs) {
  saved.recomputed = true;
  Values inputs;
  inputs.reserve(saved.inputs.size());  // the hooks below point into it
  for (size_t i = 0; i < saved.inputs.size(); ++i) {
    if (const size_t first = saved.first_of[i]; first != i) {
      inputs.push_back(inputs[first]);  // the same leaf again (self-attention's key and value): forward sees one tensor
      continue;
    }
    inputs.push_back(saved.inputs[i].defined() ? saved.inputs[i].detach() : DTensor());  // an absent one stays absent
    if (!saved.differentiable[i]) continue;
    DTensor* x = &inputs.back();
    x->requires_grad_();
    // Kept where it arrives, as the gradient of a non-leaf would be: nothing moves here.
    x->register_hook([x](const DTensor& g) {
      x->set_grad_placements(g.placements());
      return DTensor();
    });
  }
  const SeedState now = seed_state();
  set_seed_state(saved.seed);
  std::vector<DTensor> current;
  for (const auto& [slot, value] : saved.params) current.push_back(std::exchange(*slot, value));
  Values outputs;
  {
    const EnableGradGuard grad_on;  // the engine runs backward functions without recording
    std::optional<KeptOutputs::Scope> replay;
    if (saved.kept) replay.emplace(&*saved.kept, KeptOutputs::Mode::kReplay);
    outputs = saved.forward(inputs);
  }
  if (saved.kept) saved.kept->clear();  // what the recompute did not take back, if anything
  for (size_t i = 0; i < saved.params.size(); ++i) *saved.params[i].first = std::move(current[i]);
  set_seed_state(now);
  std::vector<DTensor> roots, gradients;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined() || !outputs[k].requires_grad()) continue;
    roots.push_back(std::move(outputs[k]));
    gradients.push_back(std::move(grad_outputs[k]));
  }
  outputs.clear();
  grad_outputs.clear();
  if (!roots.empty()) run_backward(std::move(roots), std::move(gradients), RetainGraph::kNo);
  std::vector<DTensor> out;
  // A leaf given as several inputs has their gradients' sum: returned once, at its first.
  for (size_t i = 0; i < inputs.size(); ++i) {
    out.push_back(saved.differentiable[i] && saved.first_of[i] == i ? inputs[i].grad() : DTensor());
  }
  out.push_back(DTensor());  // the anchor's
  return out;
}

}  // namespace

CheckpointOptions selective_policy() {
  return {.keep_ops = {kKeepableOps.begin(), kKeepableOps.end()}, .product_flops = 0.25};
}

void checkpoint(Module& module, const CheckpointOptions& options) {
  if (!options.keep_ops.empty()) (void)KeptOutputs(options.keep_ops, options.product_flops);  // checks it now
  // A leaf that requires grad, among the node's inputs so that the node is recorded even
  // when no input needs a gradient (only the parameters do); it never gets one.
  auto anchor = std::make_shared<DTensor>(
      DTensor(zeros({0}, kFloat32), DTensorSpec(single_rank_mesh(), {Replicate()}, {0}, kFloat32)));
  anchor->requires_grad_();
  module.set_forward_runner([anchor, &module, last = std::make_shared<std::weak_ptr<Saved>>(),
                             name = module.type_name(), keep_ops = options.keep_ops,
                             product_flops = options.product_flops](
                                const Values& inputs, const std::function<Values(const Values&)>& forward) {
    // Without grad, or inside a selectively checkpointed forward (or its recompute),
    // which covers this one.
    if (!grad_mode_enabled() || KeptOutputs::in_scope()) return forward(inputs);
    auto saved = std::make_shared<Saved>();
    saved->seed = seed_state();
    saved->forward = forward;
    for (auto& [_, slot] : module.named_parameters(RemoveDuplicate::kNo)) saved->params.emplace_back(slot, *slot);
    const std::shared_ptr<Saved> previous = last->lock();
    DTR_CHECK(!previous || previous->recomputed, NotImplementedError,
              "checkpoint: {} runs a second time before the backward of its first call; a checkpointed module "
              "is called once per forward (each call's recompute would hand its parameters' gradients to "
              "fully_shard and replicate apart, which expect one per backward): checkpoint the caller instead",
              name);
    *last = saved;
    // Saved before the forward runs: the saved copies share the inputs' storage, so an
    // in-place op in the forward (relu_, add_) cannot overwrite what the recompute starts from.
    std::vector<DTensor> recorded;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const DTensor& x = inputs[i];
      const size_t first = first_same(inputs, i);
      saved->first_of.push_back(first);
      saved->inputs.push_back(first != i ? saved->inputs[first] : x.defined() ? x.detach() : DTensor());
      saved->differentiable.push_back(x.defined() && x.requires_grad());
      recorded.push_back(x);
    }
    recorded.push_back(*anchor);
    Values outputs;
    {
      const NoGradGuard no_grad;
      std::optional<KeptOutputs::Scope> keep;
      if (!keep_ops.empty()) {
        keep.emplace(&saved->kept.emplace(keep_ops, product_flops), KeptOutputs::Mode::kRecord);
      }
      outputs = forward(inputs);
      if (saved->kept) saved->kept->select();
    }
    // New handles: an output that is an input (or a parameter) must not get this node.
    for (DTensor& y : outputs) {
      if (y.defined()) y = y.detach();
    }
    record("checkpoint(" + name + ")", recorded, outputs,
           [saved](std::vector<DTensor> grad_outputs) { return recompute(*saved, std::move(grad_outputs)); });
    return outputs;
  });
}

}  // namespace dtr::nn
