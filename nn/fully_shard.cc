#include "nn/fully_shard.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/trace.h"
#include "dtensor/autograd.h"
#include "dtensor/kept_outputs.h"
#include "dtensor/node_lists.h"
#include "dtensor/ops/elementwise.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "nn/parameter.h"

namespace dtr::nn {
namespace {

// The root of the forward running on this thread (the outermost sharded module), and how
// many sharded modules' forwards are open. Held weakly: a forward that threw leaves both
// behind, and its model may be gone (or another model's) when the next forward begins.
thread_local std::weak_ptr<ParallelPolicy> t_root;
thread_local int t_open_forwards = 0;
// The results of the last reduce-scatter issued on this thread, still in flight: it runs
// while backward goes on, and the next group's reduction (or the end of the last
// backward) waits for it, so at most one is in flight.
thread_local std::vector<DTensor> t_reduction_in_flight;

void wait_for_reduction() {
  for (const DTensor& t : t_reduction_in_flight) t.to_local();
  t_reduction_in_flight.clear();
}

Placements replicate_all(const DeviceMesh& mesh) { return Placements(mesh.ndim(), Replicate()); }

// `p` with its last `n` placements moved to the front, in order.
Placements rotated(Placements p, int64_t n) {
  std::rotate(p.begin(), p.end() - n, p.end());
  return p;
}

}  // namespace

// How the gather's backward reduces, shared with its autograd nodes: whether gradients are
// synced, those kept unreduced while they are not, and the scale of the reduced gradient.
struct FSDPModule::ReduceState {
  bool sync = true;
  std::vector<DTensor> grads;  // Partial, in reduce_dtype; empty when nothing is pending
  // Under --deterministic the micro-batches' unreduced gradients instead, summed in the
  // canonical tree on each rank (kernels/block_reduce.h) until a synced one reduces the root.
  std::optional<TreeSum<std::vector<DTensor>>> tree;
  double scale = 1;  // N / divide factor (set_gradient_divide_factor)
};

struct FSDPModule::Param {
  std::vector<DTensor*> slots;     // every slot holding it (tied weights: several)
  Placements placements;           // the leaf's: Shard(d), or (Replicate, Shard(d)) for HSDP
  Placements gathered_placements;  // Replicate on the FSDP mesh's dims
  DTensor sharded;                 // the leaf the optimizer steps
  DTensor gathered;                // the module's view; between forward and backward perhaps released
  // A tensor-parallel parameter's compute mesh, (dp, tp): its leaf lives on the tp-first
  // mesh (tp, dp) under (tp's placements, FSDP's), and the module reads it on this one,
  // the same dims in the order the batch's are (FSDP's, then tp's). Unset: on the FSDP mesh.
  std::optional<DeviceMesh> compute_mesh;
  int64_t fsdp_dims = 0;  // with a compute mesh: how many of its dims are FSDP's

  // The gathered tensor as the module reads it: on the compute mesh for a tensor-parallel
  // one (the same memory, its dims reordered).
  DTensor view(const DTensor& gathered_leaf) const {
    if (!compute_mesh) return gathered_leaf;
    return DTensor(gathered_leaf.to_local(), DTensorSpec(*compute_mesh, rotated(gathered_leaf.placements(), fsdp_dims),
                                                         gathered_leaf.shape(), gathered_leaf.dtype()));
  }
  // A gradient of the view as a gradient of the gathered leaf (a local move).
  DTensor lift(const DTensor& grad) const {
    if (!compute_mesh) return grad;
    const int64_t tp_dims = static_cast<int64_t>(placements.size()) - fsdp_dims;
    return DTensor(grad.to_local(),
                   DTensorSpec(sharded.mesh(), rotated(grad.placements(), tp_dims), grad.shape(), grad.dtype()));
  }

  // On a one-rank mesh the gather moves nothing: the gathered tensor is the shard's memory.
  bool aliases_shard() const { return gathered.to_local().storage().is_same(sharded.to_local().storage()); }
};

FSDPModule::FSDPModule(Module& module, const DeviceMesh& mesh, const FullyShardOptions& options)
    : module_(module),
      mesh_(mesh),
      mp_(options.mp_policy),
      offload_(options.offload_policy),
      reduce_state_(std::make_shared<ReduceState>()) {
  DTR_CHECK(mesh.ndim() == 1 || mesh.ndim() == 2, ValueError,
            "fully_shard: {} on {}: the mesh must be 1-D (FSDP) or 2-D (HSDP: replicate over dim 0, shard over "
            "dim 1)",
            module.type_name(), mesh.to_string());
  if (options.reshard_after_forward && std::holds_alternative<bool>(*options.reshard_after_forward)) {
    reshard_after_forward_ = std::get<bool>(*options.reshard_after_forward);
  } else if (options.reshard_after_forward) {
    const int k = std::get<int>(*options.reshard_after_forward);
    DTR_CHECK(mesh.ndim() == 1 && k >= 1 && mesh.size() % k == 0, ValueError,
              "fully_shard: {} on {}: reshard_after_forward = {} must divide the size of a 1-D mesh",
              module.type_name(), mesh.to_string(), k);
    reshard_after_forward_ = k > 1;
    // The mesh's ranks as [N / k, k]: groups of k consecutive ranks (collective over the mesh).
    if (k > 1 && k < mesh.size()) post_forward_mesh_ = mesh.unflatten({mesh.size() / k, k}, {"replicate", "shard"});
  }
  int64_t shard_dim = mesh.ndim() - 1;  // the mesh dim parameters are sharded over
  if (!options.shard_mesh_dim.empty()) {
    const std::vector<std::string>& names = mesh.dim_names();
    const auto it = std::find(names.begin(), names.end(), options.shard_mesh_dim);
    DTR_CHECK(it != names.end(), ValueError, "fully_shard: {} on {}: shard_mesh_dim '{}' names no mesh dim",
              module.type_name(), mesh.to_string(), options.shard_mesh_dim);
    shard_dim = it - names.begin();
  }
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
  for (auto& [name, slot] : module.named_parameters(RemoveDuplicate::kNo)) {
    if (contains(nested, *slot)) continue;
    auto tied = std::find_if(params_.begin(), params_.end(),
                             [&](const std::shared_ptr<Param>& p) { return p->gathered.is_same(*slot); });
    if (tied != params_.end()) {  // gathered holds the original here, until all are sharded
      (*tied)->slots.push_back(slot);
      continue;
    }
    const bool tp =
        is_tensor_parallel(*slot, mesh, fmt::format("fully_shard: {} parameter '{}'", module.type_name(), name));
    DTR_CHECK(tp || slot->spec().is_replicated(), ValueError,
              "fully_shard: {} parameter '{}' is {}, already sharded; fully_shard takes Replicate parameters, or "
              "tensor-parallel ones on another dim of the FSDP mesh's root (call it bottom-up: each block first, "
              "then the root, and each module once)",
              module.type_name(), name, slot->to_string());
    DTR_CHECK(slot->dim() > 0, NotImplementedError,
              "fully_shard: {} parameter '{}' is 0-d ({}); Shard(0) needs a dim to split", module.type_name(), name,
              slot->to_string());
    const std::optional<Placement> chosen =
        options.shard_placement_fn ? options.shard_placement_fn(name, *slot) : std::nullopt;
    const Placement shard = chosen.value_or(Shard(0));
    DTR_CHECK(shard.is_shard() && shard.shard_dim() >= 0 && shard.shard_dim() < slot->dim(), ValueError,
              "fully_shard: shard_placement_fn chose {} for {} parameter '{}' {}; it must be Shard(d) with "
              "0 <= d < {}",
              shard.repr(), module.type_name(), name, slot->to_string(), slot->dim());
    auto param = std::make_shared<Param>();
    param->slots.push_back(slot);
    param->gathered = *slot;
    param->placements = Placements(mesh.ndim(), Replicate());
    param->placements[shard_dim] = shard;
    param->gathered_placements = replicate_all(mesh);
    if (tp) {
      param->compute_mesh = joined_mesh(mesh, slot->mesh());
      param->fsdp_dims = mesh.ndim();
      DTR_CHECK(!compute_mesh_ || *compute_mesh_ == *param->compute_mesh, ValueError,
                "fully_shard: {} parameter '{}' is on {} but others of the group on another tp mesh (they compute "
                "on {}); a group's tensor-parallel parameters share one tp mesh",
                module.type_name(), name, slot->mesh().to_string(), compute_mesh_->to_string());
      compute_mesh_ = param->compute_mesh;
      const Placements& by_tp = slot->placements();
      param->placements.insert(param->placements.begin(), by_tp.begin(), by_tp.end());
      param->gathered_placements.insert(param->gathered_placements.begin(), by_tp.begin(), by_tp.end());
    }
    params_.push_back(std::move(param));
    names_.push_back(name);
  }
  DTR_CHECK(!compute_mesh_ || !post_forward_mesh_, ValueError,
            "fully_shard: {} on {}: reshard_after_forward as a rank count takes parameters on the FSDP mesh; its "
            "tensor-parallel parameters (on {}) take true or false",
            module.type_name(), mesh.to_string(), compute_mesh_ ? compute_mesh_->to_string() : "");
  for (const std::shared_ptr<Param>& p : params_) {
    const DeviceMesh on = p->compute_mesh ? joined_mesh(p->gathered.mesh(), mesh) : mesh;
    p->sharded = to_shard_device(distribute_parameter(p->gathered, on, p->placements, shard_device()));
    originals_.push_back(std::move(p->gathered));
    p->gathered = DTensor();
  }
  use_params(State::kSharded);
  for (auto& [name, buffer] : module.named_buffers()) {
    if (!buffer->defined() || !buffer->spec().is_replicated() || buffer->mesh() == mesh ||
        (compute_mesh_ && buffer->mesh() == *compute_mesh_)) {
      continue;
    }
    // Where the module computes: on the compute mesh when tensor parallelism placed the buffer.
    const bool tp =
        compute_mesh_ &&
        is_tensor_parallel(*buffer, mesh, fmt::format("fully_shard: {} buffer '{}'", module.type_name(), name));
    const DeviceMesh& to = tp ? *compute_mesh_ : mesh;
    *buffer = DTensor(buffer->to_local().to(to.device()),
                      DTensorSpec(to, replicate_all(to), buffer->shape(), buffer->dtype()));
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

void FSDPModule::use_params(State state) {
  for (const std::shared_ptr<Param>& p : params_) {
    for (DTensor* slot : p->slots) *slot = state == State::kUnsharded ? p->gathered : p->sharded;
  }
}

std::vector<DTensor> FSDPModule::shards_to_gather() const {
  std::vector<DTensor> out;
  const NoGradGuard no_grad;  // the link (link_to_leaves) is recorded apart
  for (const std::shared_ptr<Param>& p : params_) {
    const Tensor& local = p->sharded.to_local();
    DTensor shard = local.device() == mesh_.device()
                        ? p->sharded
                        : DTensor(local.to(mesh_.device(), /*non_blocking=*/local.is_pinned()), p->sharded.spec());
    const std::optional<DType> cast = mp_.param_dtype;
    out.push_back(cast && is_floating(shard.dtype()) && *cast != shard.dtype() ? to(shard, *cast) : shard);
  }
  return out;
}

DTensor FSDPModule::to_shard_device(const DTensor& leaf) const {
  const Tensor& local = leaf.to_local();
  Tensor moved = local.to(shard_device());
  if (offload_ && offload_->pin_memory && mesh_.device().is_cuda()) moved = moved.pin_memory(mesh_.device().index);
  if (moved.storage().is_same(local.storage())) return leaf;
  DTensor out(std::move(moved), leaf.spec());
  out.requires_grad_(leaf.requires_grad());
  return out;
}

void FSDPModule::link_to_leaves(std::vector<DTensor>& gathered) {
  std::vector<DTensor> sharded;
  std::vector<DType> dtypes;
  std::vector<Placements> placements;
  std::vector<std::shared_ptr<const Param>> params;
  for (const std::shared_ptr<Param>& p : params_) {
    sharded.push_back(p->sharded);
    dtypes.push_back(p->sharded.dtype());
    placements.push_back(p->placements);
    params.push_back(p);
  }
  const int64_t fsdp_dims = mesh_.ndim();
  const std::optional<DType> reduce_dtype = mp_.reduce_dtype;
  const Device leaf_device = shard_device();
  std::shared_ptr<ReduceState> reduce = reduce_state_;
  auto link = std::make_shared<Link>();
  const std::weak_ptr<ParallelPolicy> alive = module_.policy_state();
  record("redistribute", sharded, gathered,
         [reduce_dtype, dtypes, placements, params, fsdp_dims, leaf_device, reduce, link, alive, owner = trace_name_,
          this](const std::vector<DTensor>& grads) {
           // The backward of Shard(0) -> Replicate: the gradients (Partial: the batch is sharded)
           // become Shard(0), one coalesced reduce-scatter in reduce_dtype (HSDP: and one
           // all-reduce over the replicate dim), then the leaves' dtype and device. Every gradient is made
           // Partial over the FSDP mesh's dims first (a local move for a Replicate one, such as
           // the zeros of a parameter unused on this rank), so the group's collectives are the
           // same on every rank, whatever this rank's loss reached. A tensor-parallel one's
           // gradient comes on the compute mesh (dp, tp): the same placements on the tp-first
           // mesh (tp, dp).
           link->ran = true;
           // Groups linked after this one that the engine has not run are not reached by this
           // rank's loss (it runs nodes latest first): reduced first, as the ranks that reach
           // them do, so the order of the reductions is the same everywhere.
           if (!alive.expired() && root_ != nullptr) root_->reduce_unreached_from(link->sequence_nr);
           std::vector<DTensor> g;
           for (size_t i = 0; i < grads.size(); ++i) {
             DTensor t = params[i]->lift(grads[i]);
             if (reduce_dtype && is_floating(t.dtype()) && t.dtype() != *reduce_dtype) t = to(t, *reduce_dtype);
             Placements partial = t.placements();
             std::fill(partial.end() - fsdp_dims, partial.end(), Partial());
             if (t.placements() != partial) t = t.redistribute(partial);
             // Linear: scaling the terms scales the sum (each rank's own, whatever the placements).
             if (reduce->scale != 1) t = DTensor(dtr::mul(t.to_local(), reduce->scale), t.spec());
             g.push_back(std::move(t));
           }
           // Gradient accumulation without sync keeps the sum unreduced (a whole gradient per
           // parameter on every rank) and gives the leaves zeros (laid out as `like`, on its
           // meshes), so no collective runs now.
           auto leaf_zeros = [&](const std::vector<DTensor>& like) {
             std::vector<DTensor> zeros;
             for (size_t i = 0; i < grads.size(); ++i) {
               const DTensorSpec spec(like[i].mesh(), placements[i], grads[i].shape(), dtypes[i]);
               zeros.emplace_back(dtr::zeros(spec.local_shape(), dtypes[i], leaf_device), spec);
             }
             return zeros;
           };
           std::vector<NodeTerm> terms;  // --deterministic, node_lists: this rank's nodes
           BatchWindow window;
           if (deterministic_block_tokens() > 0) {
             window = batch_window();
             std::vector<DTensor> zeros = reduce->sync ? std::vector<DTensor>() : leaf_zeros(g);
             if (!reduce->tree) reduce->tree.emplace(add_unreduced_each);
             push_micro_batch(*reduce->tree, std::move(g), window);
             if (!reduce->sync) return zeros;
             if (window.node_lists) {
               for (auto& [node, values] : reduce->tree->take_nodes()) terms.push_back({node, std::move(values)});
             } else {
               g = reduce->tree->finish();
             }
             reduce->tree.reset();
           } else if (!reduce->grads.empty()) {  // earlier micro-batches' unreduced gradients join this reduction
             for (size_t i = 0; i < g.size(); ++i) g[i] = accumulate_gradients(reduce->grads[i], g[i]);
           }
           trace::Span span(reduce->sync ? "reduce_scatter" : "gradient sync skipped", kFsdpCategory);
           span.arg("module", owner);
           const trace::CommPhase phase("reduce_scatter", owner);
           if (!reduce->sync) {
             reduce->grads = std::move(g);
             return leaf_zeros(reduce->grads);
           }
           reduce->grads.clear();
           wait_for_reduction();
           std::vector<DTensor> out = terms.empty()
                                          ? redistribute_grouped(g, placements, Async::kYes, leaf_device)
                                          : reduce_node_lists(terms, window.rank_stride, window.total, placements);
           bool cast = false;
           for (size_t i = 0; i < out.size(); ++i) {
             if (out[i].dtype() != dtypes[i]) {
               out[i] = to(out[i], dtypes[i]);  // waits: the reduced gradient goes back to the leaf's dtype
               cast = true;
             }
           }
           // Pending gradients accumulate into undefined grads without waiting.
           if (!cast) t_reduction_in_flight = out;
           return out;
         });
  if (gathered.front().grad_fn() != nullptr) {
    link->sequence_nr = gathered.front().grad_fn()->sequence_nr();
    link_ = std::move(link);
  }
}

void FSDPModule::unshard(Async async) {
  if (state_ == State::kUnsharded || params_.empty()) return;
  trace::Span span(async == Async::kYes ? "unshard (issued)" : "unshard", kFsdpCategory);
  span.arg("module", trace_name_);
  const trace::CommPhase phase(trace::current_comm_phase(), trace_name_);  // the caller's phase, for this group
  std::vector<DTensor> gathered;
  {
    const NoGradGuard no_grad;
    const KeptOutputs::Scope not_kept(nullptr, KeptOutputs::Mode::kRecord);  // inside a checkpointed module too
    if (released_ && !post_forward_shards_.empty()) {                        // within the k ranks holding the pieces
      gathered = redistribute_coalesced(post_forward_shards_, replicate_all(*post_forward_mesh_), async);
    } else {
      std::vector<Placements> targets;
      for (const std::shared_ptr<Param>& p : params_) targets.push_back(p->gathered_placements);
      gathered = redistribute_grouped(shards_to_gather(), targets, async);
      for (size_t i = 0; i < params_.size(); ++i) gathered[i] = params_[i]->view(gathered[i]);
    }
  }
  state_ = State::kUnsharded;
  if (released_) {  // the tensors autograd saved get their bytes back in place
    refill_ = std::move(gathered);
    if (async == Async::kNo) wait_for_unshard();
    return;
  }
  link_to_leaves(gathered);
  for (size_t i = 0; i < params_.size(); ++i) params_[i]->gathered = std::move(gathered[i]);
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
  post_forward_shards_.clear();
  released_ = false;
}

void FSDPModule::reshard() {
  if (state_ != State::kUnsharded) return;
  trace::Span span("reshard", kFsdpCategory);
  span.arg("module", trace_name_);
  wait_for_unshard();
  post_forward_shards_.clear();
  if (post_forward_mesh_ && grad_mode_enabled()) {
    // Keep this rank's piece over the k-rank group (copied out: the gathered bytes go).
    for (const std::shared_ptr<Param>& p : params_) {
      post_forward_shards_.push_back(
          distribute_parameter(p->gathered.detach(), *post_forward_mesh_, {Replicate(), Shard(0)}, mesh_.device()));
    }
  }
  for (const std::shared_ptr<Param>& p : params_) {
    if (p->aliases_shard()) continue;
    Storage storage = p->gathered.to_local().storage();
    storage.release();
  }
  released_ = true;
  state_ = State::kSharded;
}

void FSDPModule::set_requires_gradient_sync(bool sync) {
  for (auto& [name, m] : module_.named_modules()) {
    if (FSDPModule* f = fsdp_module(*m)) f->reduce_state_->sync = sync;
  }
}

void FSDPModule::set_gradient_divide_factor(double factor) {
  DTR_CHECK(factor > 0 && std::isfinite(factor), ValueError,
            "set_gradient_divide_factor: {} for {}; the factor must be positive and finite", factor,
            module_.type_name());
  reduce_state_->scale = static_cast<double>(mesh_.size()) / factor;
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

namespace {

// `values` with each floating one cast to `dtype` (differentiable); unchanged when unset.
Values cast_floating(const Values& values, std::optional<DType> dtype) {
  Values out = values;
  if (!dtype) return out;
  for (size_t i = 0; i < out.size(); ++i) {
    const DTensor& v = values[i];
    if (!v.defined() || !is_floating(v.dtype()) || v.dtype() == *dtype) continue;
    const size_t first = first_same(values, i);  // one tensor given as several values: cast once
    out[i] = first < i ? out[first] : to(v, *dtype);
  }
  return out;
}

}  // namespace

FSDPModule* FSDPModule::enclosing_root() const {
  const std::shared_ptr<ParallelPolicy> alive = t_root.lock();
  auto* root = dynamic_cast<FSDPModule*>(alive.get());
  if (root == nullptr || t_open_forwards == 0) return nullptr;
  // Alive (it owns its state through its module) and this module's ancestor: the forward
  // this one runs in. Else the open forward is one that threw, of this model or another.
  return root->descendants_.contains(&module_) ? root : nullptr;
}

Values FSDPModule::pre_forward(const Values& inputs) {
  // The root of the last iteration begins a new one: no forward is open (one that threw
  // left the count behind), and a group still linked to the last graph (prefetched but not
  // run, or run without a backward) holds values from before the optimizer step.
  FSDPModule* const open_root = enclosing_root();
  if (root_ == this || open_root == nullptr) t_open_forwards = 0;
  if (t_open_forwards++ == 0) {
    t_root = module_.policy_state();
    root_ = this;
    check_ties_once();
    descendants_.clear();
    for (auto& [name, m] : module_.named_modules()) {
      descendants_.insert(m);
      FSDPModule* g = fsdp_module(*m);
      if (g == nullptr) continue;
      if (g->linked_) g->reset_to_sharded();
      if (g->trace_name_.empty()) g->trace_name_ = name.empty() ? "root" : name;
    }
    last_order_ = std::move(order_);
    order_.clear();
    ended_.clear();
  } else {
    root_ = open_root;
  }
  order().push_back(this);
  in_backward_ = false;  // a backward that threw never reached post_backward
  start_forward_gather(Async::kNo);
  wait_for_unshard();
  use_params(State::kUnsharded);
  std::vector<FSDPModule*> next = forward_prefetch_.value_or(std::vector<FSDPModule*>{next_to_run(Pass::kForward)});
  for (FSDPModule* m : next) {
    if (m != nullptr && m != this) m->start_forward_gather(Async::kYes);
  }
  return mp_.cast_forward_inputs ? cast_floating(inputs, mp_.param_dtype) : inputs;
}

void FSDPModule::check_ties_once() {
  // Every fully_shard call under this root has run: a parameter that two groups each
  // sharded (a tie across groups) would train as two copies.
  std::vector<std::pair<std::string, FSDPModule*>> groups;
  for (auto& [name, m] : module_.named_modules()) {
    if (FSDPModule* g = fsdp_module(*m); g != nullptr && !g->originals_.empty()) groups.emplace_back(name, g);
  }
  auto label = [](const std::pair<std::string, FSDPModule*>& g) {
    return fmt::format("'{}' ({})", g.first.empty() ? "the root" : g.first, g.second->module_.type_name());
  };
  for (size_t a = 0; a < groups.size(); ++a) {
    for (size_t b = a + 1; b < groups.size(); ++b) {
      for (size_t i = 0; i < groups[a].second->originals_.size(); ++i) {
        const DTensor& o = groups[a].second->originals_[i];
        const bool tied = std::any_of(groups[b].second->originals_.begin(), groups[b].second->originals_.end(),
                                      [&](const DTensor& u) { return u.is_same(o); });
        DTR_CHECK(!tied, ValueError,
                  "fully_shard: parameter '{}' of {} is tied to one of {}, which was sharded apart; modules sharing "
                  "a parameter must be in one group (shard their common parent, e.g. the root, instead)",
                  groups[a].second->names_[i], label(groups[a]), label(groups[b]));
      }
    }
  }
  for (auto& [name, g] : groups) g->originals_.clear();  // the full tensors may go now
}

void FSDPModule::adopt_replaced_leaves() {
  bool replaced = false;
  for (const std::shared_ptr<Param>& p : params_) {
    DTensor& slot = *p->slots.front();
    if (slot.is_same(p->sharded) || (p->gathered.defined() && slot.is_same(p->gathered))) continue;
    const DeviceMesh& on = p->sharded.mesh();
    DTR_CHECK(slot.mesh() == on && slot.placements() == p->placements && slot.is_leaf(), ValueError,
              "fully_shard: {}'s parameter was replaced by {}; a sharded module takes leaves placed {} on {} "
              "(load_state_dict keeps them so)",
              module_.type_name(), slot.to_string(), placements_str(p->placements), on.to_string());
    // load_state_dict or to() replaced the leaf: the group follows, keeping it on its device.
    p->sharded = to_shard_device(slot);
    for (DTensor* s : p->slots) *s = p->sharded;
    replaced = true;
  }
  if (replaced) reset_to_sharded();
}

void FSDPModule::reset_to_sharded() {
  for (const std::shared_ptr<Param>& p : params_) p->gathered = DTensor();
  link_.reset();
  refill_.clear();
  post_forward_shards_.clear();
  released_ = false;
  linked_ = false;
  state_ = State::kSharded;
}

void FSDPModule::start_forward_gather(Async async) {
  adopt_replaced_leaves();
  // Released (resharded after a forward whose backward has not run: a second forward
  // before backward) or kept from the last backward: the gathered tensors stay, refilled in
  // place when released, and this forward's graph gets its own link to the leaves.
  const bool relink = released_ || (state_ == State::kUnsharded && !linked_);
  const trace::CommPhase phase("forward all_gather", "");
  unshard(async);  // a new gather (linked), a refill, or nothing
  if (relink && grad_mode_enabled()) {
    std::vector<DTensor> gathered;
    for (const std::shared_ptr<Param>& p : params_) gathered.push_back(p->gathered.detach());
    link_to_leaves(gathered);
    for (size_t i = 0; i < params_.size(); ++i) params_[i]->gathered = std::move(gathered[i]);
  }
  linked_ = linked_ || grad_mode_enabled();
}

Values FSDPModule::post_forward(const Values& outputs) {
  use_params(State::kSharded);
  root_->ended_.push_back(this);
  --t_open_forwards;
  if (t_open_forwards == 0) t_root.reset();
  if (reshard_after_forward_.value_or(root_ != this)) reshard();
  return cast_floating(outputs, mp_.output_dtype);
}

void FSDPModule::pre_backward() {
  if (this == root_) {
    std::weak_ptr<ParallelPolicy> alive = module_.policy_state();
    queue_callback([alive, this] {
      if (!alive.expired()) finish_backward();
    });
  }
  // Groups whose forward ended after this one's get their output gradients first, so
  // where the loss reaches them their backward has begun (or prefetched them): those
  // still released are gathered first, latest first, so that every rank issues the
  // backward's all-gathers in the same order, whatever its loss reached.
  const trace::CommPhase phase("backward all_gather", "");
  const std::vector<FSDPModule*>& ended = root_->ended_;
  const auto self = std::find(ended.begin(), ended.end(), this);
  for (auto later = ended.rbegin(); self != ended.end() && later.base() != self + 1; ++later) {
    if ((*later)->released_ && (*later)->linked_) (*later)->unshard(Async::kYes);
  }
  unshard(Async::kNo);  // refills released storage; a no-op when kept or prefetched
  wait_for_unshard();
  in_backward_ = true;
  // The slots hold the gathered parameters until this group's backward ends, as in forward:
  // a forward recomputed in backward (activation checkpointing, nn/checkpoint.h) reads them.
  use_params(State::kUnsharded);
  std::vector<FSDPModule*> previous =
      backward_prefetch_.value_or(std::vector<FSDPModule*>{next_to_run(Pass::kBackward)});
  for (FSDPModule* m : previous) {
    if (m != nullptr && m != this && m->released_ && m->linked_) m->unshard(Async::kYes);
  }
}

void FSDPModule::finish_backward() {
  reduce_unreached_from(0);
  if (!is_last_backward_) return;
  wait_for_reduction();
  // The leaves' grads share the reductions waited for: reading them marks them done.
  for (FSDPModule* g : order_) {
    for (const std::shared_ptr<Param>& p : g->params_) {
      if (p->sharded.grad().defined()) p->sharded.grad().to_local();
    }
  }
}

void FSDPModule::reduce_unreached_from(uint64_t sequence_nr) {
  std::vector<FSDPModule*> unreached;
  for (FSDPModule* g : order_) {
    // Inside a recompute (nn/checkpoint.h) the backward around it may still run a group
    // whose backward has begun (a link made early by a prefetch has a smaller number than
    // the node running the recompute): that one is reached.
    const bool started = g->in_backward_ && in_nested_backward();
    const bool waiting = g->linked_ && g->link_ != nullptr && !g->link_->ran && !started;
    if (waiting && g->link_->sequence_nr >= sequence_nr &&
        std::find(unreached.begin(), unreached.end(), g) == unreached.end()) {
      unreached.push_back(g);
    }
  }
  std::sort(unreached.begin(), unreached.end(),
            [](FSDPModule* a, FSDPModule* b) { return a->link_->sequence_nr > b->link_->sequence_nr; });
  for (FSDPModule* g : unreached) {
    // The group's forward ran but this rank's loss did not depend on it: its gradients are
    // zeros, reduced (its link's backward runs) with the other ranks' real ones.
    std::vector<DTensor> roots, zero_grads;
    for (const std::shared_ptr<Param>& p : g->params_) {
      const DTensorSpec& spec = p->gathered.spec();
      roots.push_back(p->gathered);
      zero_grads.emplace_back(dtr::zeros(spec.local_shape(), spec.dtype(), spec.mesh().device()), spec);
    }
    run_backward(std::move(roots), std::move(zero_grads), RetainGraph::kNo);
  }
}

void FSDPModule::set_is_last_backward(bool last) {
  for (auto& [name, m] : module_.named_modules()) {
    if (FSDPModule* f = fsdp_module(*m)) f->is_last_backward_ = last;
  }
}

void FSDPModule::post_backward() {
  in_backward_ = false;
  use_params(State::kSharded);
  linked_ = false;
  if (!reshard_after_backward_) return;
  reset_to_sharded();
}

FSDPModule& fully_shard(Module& module, const DeviceMesh& mesh, const FullyShardOptions& options) {
  DTR_CHECK(module.policy_state() == nullptr, ValueError,
            "fully_shard: this {} is already {}; call fully_shard once per module", module.type_name(),
            fsdp_module(module) != nullptr ? "sharded" : "replicated");
  auto state = std::make_shared<FSDPModule>(module, mesh, options);
  FSDPModule* s = state.get();
  module.register_forward_pre_hook([s](Module&, const Values& inputs) -> std::optional<Values> {
    for (const DTensor& x : inputs) {
      const bool tp = s->compute_mesh_ && x.defined() && x.mesh() == *s->compute_mesh_;
      DTR_CHECK(!x.defined() || x.mesh() == s->mesh() || tp, ValueError,
                "fully_shard: {} got input {} on another mesh than its parameters' {}{}", s->module().type_name(),
                x.to_string(), s->compute_mesh_.value_or(s->mesh()).to_string(),
                s->compute_mesh_ ? " (under FSDP x TP the batch is one DTensor on that mesh, Shard(0) over its data-"
                                   "parallel dims and Replicate over tp)"
                                 : "");
    }
    return s->pre_forward(inputs);
  });
  module.register_forward_hook(
      [s](Module&, const Values&, const Values& outputs) -> std::optional<Values> { return s->post_forward(outputs); });
  module.register_backward_pre_hook([s](Module&) { s->pre_backward(); });
  module.register_post_backward_hook([s](Module&) { s->post_backward(); });
  module.policy_state() = state;
  return *s;
}

void set_prefetch_depth(FSDPModule& root, const std::vector<FSDPModule*>& blocks, int64_t depth) {
  DTR_CHECK(depth >= 0, ValueError, "set_prefetch_depth: depth {} for {} blocks; it must be 0 (off) or more", depth,
            blocks.size());
  const auto n = static_cast<int64_t>(blocks.size());
  // Blocks `from`, `from` + step, ... for `depth` blocks, those in 0..n-1.
  auto run = [&](int64_t from, int64_t step) {
    std::vector<FSDPModule*> out;
    for (int64_t k = from, left = depth; left > 0 && 0 <= k && k < n; k += step, --left) out.push_back(blocks[k]);
    return out;
  };
  root.set_modules_to_forward_prefetch(run(0, 1));
  root.set_modules_to_backward_prefetch(run(n - 1, -1));
  for (int64_t i = 0; i < n; ++i) {
    blocks[i]->set_modules_to_forward_prefetch(run(i + 1, 1));
    blocks[i]->set_modules_to_backward_prefetch(run(i - 1, -1));
  }
}

FSDPModule* fsdp_module(Module& module) { return dynamic_cast<FSDPModule*>(module.policy_state().get()); }

}  // namespace dtr::nn
