#include "nn/replicate.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "core/trace.h"
#include "dtensor/autograd.h"
#include "dtensor/node_lists.h"
#include "dtensor/placement.h"
#include "nn/parameter.h"

namespace dtr::nn {
namespace {

// A parameter's gradient until its bucket moves: its placements with Partial over the
// (1-D) data-parallel mesh, dim 0 (the batch is split there).
Placements summed_over_data(const DTensor& param) {
  Placements p = param.placements();
  p.front() = Partial();
  return p;
}

}  // namespace

DDPModule::DDPModule(Module& module, const DeviceMesh& mesh, const ReplicateOptions& options)
    : type_name_(module.type_name()) {
  DTR_CHECK(mesh.ndim() == 1, ValueError, "replicate: {} on {}: the mesh must be 1-D", module.type_name(),
            mesh.to_string());
  DTR_CHECK(options.bucket_cap_mb > 0, ValueError, "replicate: bucket_cap_mb is {}; it must be positive",
            options.bucket_cap_mb);
  // Every slot by the parameter object it holds (tied slots hold one), before any is moved.
  std::unordered_map<const void*, std::vector<DTensor*>> slots;
  for (auto& [name, slot] : module.named_parameters(RemoveDuplicate::kNo)) slots[slot->identity()].push_back(slot);
  for (auto& [name, p] : module.named_parameters()) {
    const bool tp = is_tensor_parallel(*p, mesh, fmt::format("replicate: {} parameter '{}'", module.type_name(), name));
    DTR_CHECK(tp || p->spec().is_replicated(), ValueError,
              "replicate: {} parameter '{}' is {}; replicate takes Replicate parameters, or tensor-parallel ones on "
              "another dim of the mesh's root",
              module.type_name(), name, p->to_string());
    // Where the module computes: the mesh, or for a tensor-parallel parameter the (dp, tp)
    // mesh, Replicate over dp (the same local piece).
    const DeviceMesh on = tp ? joined_mesh(mesh, p->mesh()) : mesh;
    Placements placements(static_cast<size_t>(mesh.ndim()), Replicate());
    if (tp) placements.insert(placements.end(), p->placements().begin(), p->placements().end());
    if (p->mesh() != on) {
      DTensor moved(p->to_local().to(on.device()), DTensorSpec(on, placements, p->shape(), p->dtype()));
      moved.requires_grad_(p->requires_grad());
      // Tied slots hold the same DTensor: every slot holding it gets the moved one.
      for (DTensor* slot : slots.at(p->identity())) *slot = moved;
    }
    if (p->requires_grad()) params_.push_back(p);
  }
  for (auto& [name, buffer] : module.named_buffers()) {  // tensor parallelism's go where the module computes
    if (!buffer->defined() || !buffer->spec().is_replicated() ||
        !is_tensor_parallel(*buffer, mesh, fmt::format("replicate: {} buffer '{}'", module.type_name(), name))) {
      continue;
    }
    const DeviceMesh on = joined_mesh(mesh, buffer->mesh());
    *buffer = DTensor(buffer->to_local(), DTensorSpec(on, Placements(static_cast<size_t>(on.ndim()), Replicate()),
                                                      buffer->shape(), buffer->dtype()));
  }
  // Buckets in reverse registration order, each closed once it holds bucket_cap_mb.
  const double cap = options.bucket_cap_mb * 1024 * 1024;
  bucket_of_.resize(params_.size());
  double bytes = cap;
  for (size_t k = params_.size(); k-- > 0;) {
    if (bytes >= cap) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    bytes += static_cast<double>(params_[k]->numel()) * static_cast<double>(itemsize(params_[k]->dtype()));
  }
  waiting_.resize(buckets_.size());
  reduced_.resize(buckets_.size());
  arrived_.resize(params_.size());
  unsynced_.resize(params_.size());
  for (size_t k = 0; k < params_.size(); ++k) {
    params_[k]->set_grad_placements(summed_over_data(*params_[k]));  // kept unreduced until its bucket moves
  }
}

void DDPModule::check_last_backward_complete() const {
  DTR_CHECK(!in_backward_, ValueError,
            "replicate: the last backward through this {} did not finish (it threw), so some of its gradients were "
            "never all-reduced; the ranks' collectives may no longer match",
            type_name_);
}

void DDPModule::issue_ready_buckets() {
  // In bucket order on every rank, whatever order this rank's gradients arrived in.
  while (next_bucket_ < buckets_.size() && waiting_[next_bucket_] == 0) {
    const std::vector<size_t>& bucket = buckets_[next_bucket_];
    const trace::CommPhase phase("all_reduce",
                                 trace::enabled(trace::Category::kIssue) ? fmt::format("bucket {}", next_bucket_) : "");
    // One coalesced all-reduce per distinct placement in the bucket (one, but for tensor
    // parallelism's parameters, placed apart on tp), in the bucket's order.
    std::vector<DTensor> grads;
    std::vector<Placements> targets;
    for (size_t k : bucket) {
      grads.push_back(partial_grad(*params_[k], summed_over_data(*params_[k])));
      targets.push_back(params_[k]->placements());
    }
    reduced_[next_bucket_++] = redistribute_grouped(grads, targets, Async::kYes);
  }
}

// Under --deterministic: the parameter's gradient from this backward (zeros where its loss did
// not reach it), taken from the leaf so that the engine never adds two micro-batches'
// gradients in arrival order (nor reduces them: two Partials meeting under the mode are),
// as one leaf of its tree (rank-major micro-batches: at this rank's node of the step's
// batch); with sync on, the leaf gets the tree's root back, or under node lists keeps the tree
// for finish_backward's one reduction of every parameter's nodes.
void DDPModule::push_unsynced(size_t index) {
  DTensor& p = *params_[index];
  std::optional<TreeSum<DTensor>>& tree = unsynced_[index];
  if (!tree) tree.emplace(add_unreduced);
  const BatchWindow window = batch_window();
  push_micro_batch(*tree, partial_grad(p, summed_over_data(p)), window);
  p.set_grad(DTensor());
  if (!sync_ || window.node_lists) return;
  p.set_grad(tree->finish());
  tree.reset();
}

// Under node lists (kernels/block_reduce.h's BatchWindow): every parameter's nodes, reduced
// over the data-parallel group in the tree by one reduce_node_lists, instead of the buckets.
void DDPModule::reduce_unsynced_lists() {
  std::vector<NodeTerm> terms;
  std::vector<Placements> targets;
  for (size_t k = 0; k < params_.size(); ++k) {
    std::vector<std::pair<TreeNode, DTensor>> nodes = unsynced_[k]->take_nodes();
    unsynced_[k].reset();
    if (terms.empty()) terms.resize(nodes.size());
    DTR_INTERNAL_ASSERT(nodes.size() == terms.size(), "replicate: parameter {} has {} nodes, parameter 0 {}", k,
                        nodes.size(), terms.size());
    for (size_t s = 0; s < nodes.size(); ++s) {
      terms[s].node = nodes[s].first;
      terms[s].values.push_back(std::move(nodes[s].second));
    }
    targets.push_back(params_[k]->placements());
  }
  const BatchWindow window = batch_window();
  const std::vector<DTensor> reduced = reduce_node_lists(terms, window.rank_stride, window.total, targets);
  for (size_t k = 0; k < params_.size(); ++k) params_[k]->set_grad(reduced[k]);
}

void DDPModule::on_gradient(size_t index) {
  const bool deterministic = deterministic_block_tokens() > 0;
  if (!sync_ && !deterministic) return;
  if (!in_backward_) {  // this backward's first gradient
    in_backward_ = true;
    next_bucket_ = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) waiting_[b] = buckets_[b].size();
    std::fill(arrived_.begin(), arrived_.end(), false);
    const std::weak_ptr<ParallelPolicy> alive = self_;
    queue_callback([alive, this] {
      if (!alive.expired()) finish_backward();
    });
  }
  DTR_CHECK(!deterministic || !arrived_[index], NotImplementedError,
            "replicate under --deterministic: a parameter of {} got a second gradient in one backward; each "
            "micro-batch's gradient is one leaf of its tree",
            type_name_);
  if (arrived_[index]) return;  // a second gradient for the parameter in this backward
  arrived_[index] = true;
  if (deterministic) push_unsynced(index);
  if (!sync_ || (deterministic && batch_window().node_lists)) return;
  --waiting_[bucket_of_[index]];
  issue_ready_buckets();
}

void DDPModule::finish_backward() {
  // A parameter this rank's loss did not reach joins its bucket with a zero gradient
  // (partial_grad), so every rank all-reduces every bucket; under --deterministic it is a
  // zero leaf of its tree (and, synced, the root joins its bucket).
  if (deterministic_block_tokens() > 0) {
    for (size_t k = 0; k < params_.size(); ++k) {
      if (!arrived_[k]) push_unsynced(k);
    }
  }
  if (!sync_) {
    in_backward_ = false;
    return;
  }
  if (deterministic_block_tokens() > 0 && batch_window().node_lists) {
    reduce_unsynced_lists();
    in_backward_ = false;
    return;
  }
  std::fill(waiting_.begin(), waiting_.end(), 0);
  issue_ready_buckets();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t i = 0; i < buckets_[b].size(); ++i) {
      reduced_[b][i].to_local();  // waits for the bucket's all-reduce
      params_[buckets_[b][i]]->set_grad(reduced_[b][i]);
    }
    reduced_[b].clear();
  }
  in_backward_ = false;
}

DDPModule& replicate(Module& module, const DeviceMesh& mesh, const ReplicateOptions& options) {
  DTR_CHECK(module.policy_state() == nullptr, ValueError,
            "replicate: this {} is already replicated or sharded; a module takes one parallel policy",
            module.type_name());
  auto state = std::make_shared<DDPModule>(module, mesh, options);
  DDPModule* s = state.get();
  // The parameters' hooks hold the module's state weakly: a parameter may outlive it.
  const std::weak_ptr<DDPModule> weak = state;
  for (size_t k = 0; k < s->params_.size(); ++k) {
    s->params_[k]->register_post_accumulate_grad_hook([weak, k](const DTensor&) {
      if (const std::shared_ptr<DDPModule> alive = weak.lock()) alive->on_gradient(k);
    });
  }
  module.register_forward_pre_hook([s](Module&, const Values&) -> std::optional<Values> {
    s->check_last_backward_complete();
    return std::nullopt;
  });
  s->self_ = state;
  module.policy_state() = state;
  return *s;
}

}  // namespace dtr::nn
