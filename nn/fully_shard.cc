#include "nn/fully_shard.h"

#include <algorithm>

#include "dtensor/autograd.h"
#include "kernels/error.h"

namespace dtr::nn {
namespace {

// The root of the forward running on this thread (the outermost sharded module), and how
// many sharded modules' forwards are open.
thread_local FSDPModule* t_root = nullptr;
thread_local int t_open_forwards = 0;

Placements replicate_all(const DeviceMesh& mesh) { return Placements(mesh.ndim(), Replicate()); }

bool is_replicate(const DTensor& t) {
  return std::all_of(t.placements().begin(), t.placements().end(), [](const Placement& p) { return p.is_replicate(); });
}

// This rank's Shard(0) chunk of a Replicate parameter, as a new leaf on `mesh` that owns its
// memory (the full tensor can be freed).
DTensor shard_parameter(const DTensor& full, const DeviceMesh& mesh) {
  DTensorSpec spec(mesh, {Shard(0)}, full.shape(), full.dtype());
  const Tensor block = block_of(full.to_local(), spec.local_box());
  Tensor local = Tensor::empty(block.shape(), block.dtype(), block.device());
  local.copy_(block);
  DTensor sharded(std::move(local), std::move(spec));
  sharded.requires_grad_(full.requires_grad());
  return sharded;
}

}  // namespace

struct FSDPModule::Param {
  std::vector<DTensor*> slots;  // every slot holding it (tied weights: several)
  DTensor sharded;              // the leaf the optimizer steps
  DTensor gathered;             // Replicate; between forward and backward perhaps released

  // On a one-rank mesh the gather moves nothing: the gathered tensor is the shard's memory.
  bool aliases_shard() const { return gathered.to_local().storage().is_same(sharded.to_local().storage()); }
};

FSDPModule::FSDPModule(Module& module, const DeviceMesh& mesh, const FullyShardOptions& options)
    : module_(module), mesh_(mesh), reshard_after_forward_(options.reshard_after_forward) {
  DTR_CHECK(mesh.ndim() == 1, ValueError,
            "fully_shard: {} on {}: the mesh must be 1-D (FSDP); HSDP over a 2-D mesh is not supported yet",
            module.type_name(), mesh.to_string());
  // Parameters owned by groups below this module stay theirs (fully_shard goes bottom-up).
  std::vector<DTensor> nested;
  for (auto& [name, m] : module.named_modules()) {
    if (name.empty()) continue;
    if (FSDPModule* child = fsdp_module(*m)) {
      for (const auto& p : child->params_) nested.push_back(p->sharded);
    }
  }
  auto contains = [](const std::vector<DTensor>& v, const DTensor& t) {
    return std::any_of(v.begin(), v.end(), [&](const DTensor& u) { return u.is_same(t); });
  };
  for (auto& [name, slot] : module.named_parameters(/*remove_duplicate=*/false)) {
    if (contains(nested, *slot)) continue;
    auto tied = std::find_if(params_.begin(), params_.end(),
                             [&](const std::shared_ptr<Param>& p) { return p->gathered.is_same(*slot); });
    if (tied != params_.end()) {  // gathered holds the original here, until all are sharded
      (*tied)->slots.push_back(slot);
      continue;
    }
    DTR_CHECK(is_replicate(*slot), ValueError,
              "fully_shard: {} parameter '{}' is {}, already sharded; fully_shard takes Replicate parameters "
              "(call it bottom-up: each block first, then the root, and each module once)",
              module.type_name(), name, slot->to_string());
    DTR_CHECK(slot->dim() > 0, NotImplementedError,
              "fully_shard: {} parameter '{}' is 0-d ({}); Shard(0) needs a dim to split", module.type_name(), name,
              slot->to_string());
    auto param = std::make_shared<Param>();
    param->slots.push_back(slot);
    param->gathered = *slot;
    params_.push_back(std::move(param));
    names_.push_back(name);
  }
  for (const std::shared_ptr<Param>& p : params_) {
    p->sharded = shard_parameter(p->gathered, mesh);
    p->gathered = DTensor();
  }
  use_gathered(false);
  for (auto& [name, buffer] : module.named_buffers()) {
    if (buffer->defined() && buffer->mesh() != mesh && is_replicate(*buffer)) {
      *buffer = DTensor(buffer->to_local(), DTensorSpec(mesh, replicate_all(mesh), buffer->shape(), buffer->dtype()));
    }
  }
}

int64_t FSDPModule::gathered_bytes() const {
  if (state_ != State::kUnsharded) return 0;
  int64_t bytes = 0;
  for (const std::shared_ptr<Param>& p : params_) {
    if (!p->aliases_shard()) bytes += static_cast<int64_t>(p->gathered.to_local().nbytes());
  }
  return bytes;
}

void FSDPModule::use_gathered(bool gathered) {
  for (const std::shared_ptr<Param>& p : params_) {
    for (DTensor* slot : p->slots) *slot = gathered ? p->gathered : p->sharded;
  }
}

void FSDPModule::unshard(Async async) {
  if (state_ == State::kUnsharded || params_.empty()) return;
  std::vector<DTensor> sharded;
  for (const std::shared_ptr<Param>& p : params_) sharded.push_back(p->sharded);
  if (released_) {
    // The tensors autograd saved get their bytes back in place (wait_for_unshard).
    const NoGradGuard no_grad;
    refill_ = redistribute_coalesced(sharded, replicate_all(mesh_), async);
    state_ = State::kUnsharded;
    if (async == Async::kNo) wait_for_unshard();
    return;
  }
  // A new gather, recorded by autograd: its backward is the reduce-scatter.
  std::vector<DTensor> gathered = redistribute_coalesced(sharded, replicate_all(mesh_), async);
  for (size_t i = 0; i < params_.size(); ++i) params_[i]->gathered = std::move(gathered[i]);
  state_ = State::kUnsharded;
}

void FSDPModule::wait_for_unshard() {
  if (refill_.empty()) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i]->aliases_shard()) continue;
    Tensor local = params_[i]->gathered.to_local();
    const Tensor& fresh = refill_[i].to_local();
    Storage storage = local.storage();
    storage.allocate(fresh.nbytes());
    local.copy_(fresh);
  }
  refill_.clear();
  released_ = false;
}

void FSDPModule::reshard() {
  if (state_ != State::kUnsharded) return;
  wait_for_unshard();
  for (const std::shared_ptr<Param>& p : params_) {
    if (p->aliases_shard()) continue;
    Storage storage = p->gathered.to_local().storage();
    storage.release();
  }
  released_ = true;
  state_ = State::kSharded;
}

void FSDPModule::set_modules_to_forward_prefetch(std::vector<FSDPModule*> modules) {
  forward_prefetch_ = std::move(modules);
}

void FSDPModule::set_modules_to_backward_prefetch(std::vector<FSDPModule*> modules) {
  backward_prefetch_ = std::move(modules);
}

std::vector<FSDPModule*>& FSDPModule::order() { return root_->order_; }

FSDPModule* FSDPModule::next_to_run(Pass pass) {
  // Forward looks ahead in the last iteration's order; backward runs this one's in reverse,
  // except the root (first in the order), whose backward begins first.
  const std::vector<FSDPModule*>& o = pass == Pass::kForward ? root_->last_order_ : root_->order_;
  const auto it = std::find(o.begin(), o.end(), this);
  if (it == o.end()) return nullptr;
  const std::ptrdiff_t at = it - o.begin(), size = static_cast<std::ptrdiff_t>(o.size());
  if (pass == Pass::kForward) return at + 1 < size ? o[at + 1] : nullptr;
  if (this == root_) return size > 1 ? o.back() : nullptr;
  return at - 1 >= 1 ? o[at - 1] : nullptr;
}

void FSDPModule::pre_forward() {
  if (t_open_forwards++ == 0) {
    t_root = this;
    root_ = this;
    last_order_ = std::move(order_);
    order_.clear();
  } else {
    root_ = t_root;
  }
  order().push_back(this);
  start_forward_gather(Async::kNo);
  use_gathered(true);
  std::vector<FSDPModule*> next = forward_prefetch_.value_or(std::vector<FSDPModule*>{next_to_run(Pass::kForward)});
  for (FSDPModule* m : next) {
    if (m != nullptr && m != this) m->start_forward_gather(Async::kYes);
  }
}

void FSDPModule::start_forward_gather(Async async) {
  if (released_) {  // a forward without backward left its gathered tensors released: gather anew
    for (const std::shared_ptr<Param>& p : params_) p->gathered = DTensor();
    released_ = false;
  }
  if (state_ == State::kUnsharded && !linked_) {
    // Kept from the last backward (reshard_after_backward false): the values stand, but this
    // forward's graph needs its own link to the leaves, whose backward is the reduce-scatter.
    std::vector<DTensor> sharded, gathered;
    for (const std::shared_ptr<Param>& p : params_) {
      sharded.push_back(p->sharded);
      gathered.push_back(p->gathered.detach());
    }
    record("redistribute", sharded, gathered,
           [](const std::vector<DTensor>& grads) { return redistribute_coalesced(grads, {Shard(0)}); });
    for (size_t i = 0; i < params_.size(); ++i) params_[i]->gathered = std::move(gathered[i]);
  }
  unshard(async);
  linked_ = grad_mode_enabled();
}

void FSDPModule::post_forward() {
  use_gathered(false);
  --t_open_forwards;
  if (t_open_forwards == 0) t_root = nullptr;
  if (reshard_after_forward_.value_or(root_ != this)) reshard();
}

void FSDPModule::pre_backward() {
  unshard(Async::kNo);  // refills released storage; a no-op when kept or prefetched
  wait_for_unshard();
  std::vector<FSDPModule*> previous =
      backward_prefetch_.value_or(std::vector<FSDPModule*>{next_to_run(Pass::kBackward)});
  for (FSDPModule* m : previous) {
    if (m != nullptr && m != this && m->released_) m->unshard(Async::kYes);
  }
}

void FSDPModule::post_backward() {
  linked_ = false;
  if (!reshard_after_backward_) return;
  wait_for_unshard();
  for (const std::shared_ptr<Param>& p : params_) p->gathered = DTensor();
  released_ = false;
  state_ = State::kSharded;
}

FSDPModule& fully_shard(Module& module, const DeviceMesh& mesh, const FullyShardOptions& options) {
  DTR_CHECK(fsdp_module(module) == nullptr, ValueError,
            "fully_shard: this {} is already sharded; call fully_shard once per module", module.type_name());
  auto state = std::make_shared<FSDPModule>(module, mesh, options);
  FSDPModule* s = state.get();
  module.register_forward_pre_hook([s](Module&, const Values& inputs) -> std::optional<Values> {
    for (const DTensor& x : inputs) {
      DTR_CHECK(!x.defined() || x.mesh() == s->mesh(), ValueError,
                "fully_shard: {} got input {} on another mesh than its parameters' {}", s->module().type_name(),
                x.to_string(), s->mesh().to_string());
    }
    s->pre_forward();
    return std::nullopt;
  });
  module.register_forward_hook([s](Module&, const Values&, const Values&) -> std::optional<Values> {
    s->post_forward();
    return std::nullopt;
  });
  module.register_backward_pre_hook([s](Module&) { s->pre_backward(); });
  module.register_post_backward_hook([s](Module&) { s->post_backward(); });
  module.policy_state() = state;
  return *s;
}

FSDPModule* fsdp_module(Module& module) { return static_cast<FSDPModule*>(module.policy_state().get()); }

}  // namespace dtr::nn
