#include "nn/replicate.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "kernels/error.h"

namespace dtr::nn {

DDPModule::DDPModule(Module& module, const DeviceMesh& mesh, const ReplicateOptions& options) {
  DTR_CHECK(mesh.ndim() == 1, ValueError, "replicate: {} on {}: the mesh must be 1-D", module.type_name(),
            mesh.to_string());
  DTR_CHECK(options.bucket_cap_mb > 0, ValueError, "replicate: bucket_cap_mb is {}; it must be positive",
            options.bucket_cap_mb);
  const Placements replicate_all{Replicate()};
  for (auto& [name, p] : module.named_parameters()) {
    DTR_CHECK(p->spec().is_replicated(), ValueError,
              "replicate: {} parameter '{}' is {}; replicate takes Replicate parameters", module.type_name(), name,
              p->to_string());
    if (p->mesh() != mesh) {
      DTensor moved(p->to_local(), DTensorSpec(mesh, replicate_all, p->shape(), p->dtype()));
      moved.requires_grad_(p->requires_grad());
      // Tied slots hold the same DTensor: every slot holding it gets the moved one.
      for (auto& [other, slot] : module.named_parameters(/*remove_duplicate=*/false)) {
        if (slot != p && slot->is_same(*p)) *slot = moved;
      }
      *p = moved;
    }
    if (p->requires_grad()) params_.push_back(p);
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
  for (size_t k = 0; k < params_.size(); ++k) {
    params_[k]->set_grad_placements({Partial()});  // kept unreduced until its bucket moves
  }
}

void DDPModule::check_last_backward_complete() const {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    DTR_CHECK(waiting_[b] == 0 && reduced_[b].empty(), ValueError,
              "replicate: the last backward left bucket {} unreduced: some parameters got no gradient, so their "
              "gradients were never all-reduced (replicate needs every parameter used in each step)",
              b);
  }
}

void DDPModule::issue(size_t b) {
  std::vector<DTensor> grads;
  for (size_t k : buckets_[b]) grads.push_back(params_[k]->grad());
  reduced_[b] = redistribute_coalesced(grads, {Replicate()}, Async::kYes);
}

void DDPModule::on_gradient(size_t index) {
  const size_t b = bucket_of_[index];
  if (!reduced_[b].empty()) return;                        // issued already (by finish_backward)
  if (waiting_[b] == 0) waiting_[b] = buckets_[b].size();  // the bucket's first gradient this backward
  if (--waiting_[b] == 0) issue(b);
}

void DDPModule::finish_backward() {
  // Every parameter has its gradient now; a bucket whose last hook has not run yet (the
  // module was called before replicate, so its count-down hook comes first) is issued here.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (reduced_[b].empty()) issue(b);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t i = 0; i < buckets_[b].size(); ++i) {
      reduced_[b][i].to_local();  // waits for the bucket's all-reduce
      params_[buckets_[b][i]]->set_grad(reduced_[b][i]);
    }
    reduced_[b].clear();
    waiting_[b] = 0;
  }
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
  module.register_post_backward_hook([s](Module&) { s->finish_backward(); });
  module.policy_state() = state;
  return *s;
}

}  // namespace dtr::nn
