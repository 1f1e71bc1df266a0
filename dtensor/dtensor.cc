#include "dtensor/dtensor.h"

#include <algorithm>
#include <atomic>

#include "collectives/process_group.h"
#include "dtensor/autograd.h"
#include "dtensor/internal/dtensor_impl.h"
#include "dtensor/kept_outputs.h"
#include "kernels/fill.h"

namespace dtr {
namespace {

std::string describe_placements_on(const DeviceMesh& mesh, const Placements& placements) {
  return fmt::format("{} on {}", placements_str(placements), mesh.to_string());
}

// Every mesh rank's `values` (all of one length), in row-major mesh order: one small
// all_gather per mesh dim, innermost first.
std::vector<std::vector<int64_t>> all_gather_mesh(const DeviceMesh& mesh, const std::vector<int64_t>& values) {
  Tensor data = Tensor::from_vector(values).to(mesh.device());
  for (int64_t m = mesh.ndim() - 1; m >= 0; --m) {
    ProcessGroup& group = mesh.group(m);
    Tensor gathered = Tensor::empty({group.size() * data.numel()}, kInt64, data.device());
    group.all_gather_into_tensor(gathered, data).wait();
    data = gathered;
  }
  data = data.to(kCPU);
  const int64_t* p = data.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    out.emplace_back(p + r * static_cast<int64_t>(values.size()), p + (r + 1) * static_cast<int64_t>(values.size()));
  }
  return out;
}

}  // namespace

DTensor::DTensor(Tensor local, DTensorSpec spec) : impl_(std::make_shared<Impl>()) {
  const Shape expected = spec.local_shape();
  DTR_CHECK(local.defined() && local.shape() == expected && local.dtype() == spec.dtype(), ValueError,
            "DTensor: local tensor {} does not match the spec {}: this rank (coordinate {}) holds {}{}",
            describe(local), spec.to_string(), spec.mesh().coordinate(), dtype_name(spec.dtype()), expected);
  impl_->local = std::move(local);
  impl_->spec = std::move(spec);
}

DTensor::Impl& DTensor::impl() const {
  DTR_CHECK(impl_ != nullptr, ValueError, "DTensor: use of an undefined DTensor");
  return *impl_;
}

const DTensorSpec& DTensor::spec() const { return *impl().spec; }

bool DTensor::is_pending() const { return impl().pending != nullptr; }

bool DTensor::is_sole_owner() const {
  return impl_.use_count() == 1 && !is_pending() && !impl().local.storage().is_shared();
}

const Tensor& DTensor::to_local() const {
  Impl& i = impl();
  if (i.pending) {
    i.local = i.pending->wait()[i.pending_index];
    i.pending.reset();
  }
  return i.local;
}

Tensor DTensor::full_tensor() const { return redistribute(Placements(mesh().ndim(), Replicate())).to_local(); }

double DTensor::item() const {
  DTR_CHECK(numel() == 1, ValueError, "item: {} has {} elements; item() needs exactly one", to_string(), numel());
  NoGradGuard no_grad;
  return full_tensor().item();
}

DTensor DTensor::redistribute(const Placements& placements, Async async) const {
  return redistribute_coalesced(std::span(this, 1), placements, async).front();
}

DTensor DTensor::redistribute(const DeviceMesh& mesh, const Placements& placements, Async async) const {
  DTR_CHECK(mesh == this->mesh(), ValueError,
            "redistribute: {} lives on {}; moving it to {} is a cross-mesh redistribute, which dtr does not "
            "support (redistribute on its own mesh)",
            spec().to_string(), this->mesh().to_string(), mesh.to_string());
  return redistribute(placements, async);
}

bool DTensor::requires_grad() const { return impl().requires_grad; }

DTensor& DTensor::requires_grad_(bool requires_grad) {
  DTR_CHECK(is_leaf(), ValueError,
            "requires_grad_: {} was produced by {}; only leaves can change requires_grad (detach() it first)",
            to_string(), impl().grad_fn->name());
  impl().requires_grad = requires_grad;
  return *this;
}

bool DTensor::is_leaf() const { return impl().grad_fn == nullptr; }

const DTensor& DTensor::grad() const { return impl().grad; }

void DTensor::set_grad(DTensor grad) const {
  DTR_CHECK(!grad.defined() || (grad.shape() == shape() && grad.dtype() == dtype()), ValueError,
            "set_grad: gradient {} for {}: shapes and dtypes must match", grad.to_string(), to_string());
  impl().grad = std::move(grad);
}

const std::shared_ptr<Node>& DTensor::grad_fn() const { return impl().grad_fn; }

void DTensor::backward(DTensor gradient, RetainGraph retain_graph) const {
  std::vector<DTensor> gradients;
  if (gradient.defined()) gradients.push_back(std::move(gradient));
  run_backward({*this}, std::move(gradients), retain_graph);
}

DTensor DTensor::detach() const {
  auto impl = std::make_shared<Impl>();
  const Impl& i = this->impl();
  if (i.pending) {  // still in flight: the detached tensor waits for the same move
    impl->pending = i.pending;
    impl->pending_index = i.pending_index;
  } else {
    impl->local = i.local;
  }
  impl->spec = spec();
  return DTensor(std::move(impl));
}

int DTensor::register_hook(std::function<DTensor(const DTensor&)> hook) const {
  DTR_CHECK(requires_grad(), ValueError, "register_hook: {} does not require grad; its gradient is never computed",
            to_string());
  // Unique in the process: two outputs of one node keep their hooks apart on that node, and
  // no other tensor's id can name one of this tensor's hooks.
  static std::atomic<int> next_hook_id{0};
  const int id = next_hook_id.fetch_add(1, std::memory_order_relaxed);
  if (impl().grad_fn) {
    impl().grad_fn->add_pre_hook(id, impl().output_nr, std::move(hook));
    impl().node_hooks.emplace(id, std::make_pair(std::weak_ptr<Node>(impl().grad_fn), impl().output_nr));
  } else {
    impl().hooks.emplace(id, std::move(hook));
  }
  return id;
}

void DTensor::remove_hook(int id) const {
  impl().hooks.erase(id);
  const auto it = impl().node_hooks.find(id);
  if (it == impl().node_hooks.end()) return;
  if (const std::shared_ptr<Node> node = it->second.first.lock()) node->remove_pre_hook(id, it->second.second);
  impl().node_hooks.erase(it);
}

void DTensor::register_post_accumulate_grad_hook(std::function<void(const DTensor&)> hook) const {
  DTR_CHECK(is_leaf() && requires_grad(), ValueError,
            "register_post_accumulate_grad_hook: {} is not a leaf that requires grad", to_string());
  impl().post_accumulate_hooks.push_back(std::move(hook));
}

void DTensor::set_grad_placements(Placements placements) const {
  DTR_CHECK(is_leaf(), ValueError, "set_grad_placements: {} is not a leaf", to_string());
  spec().with_placements(placements);  // validates
  impl().grad_placements = std::move(placements);
}

std::string DTensor::to_string() const {
  if (!defined()) return "DTensor(undefined)";
  return fmt::format("DTensor({}, local {}{})", impl_->spec->to_string(),
                     is_pending() ? "pending" : describe(impl_->local), requires_grad() ? ", requires_grad" : "");
}

std::vector<DTensor> redistribute_coalesced(std::span<const DTensor> tensors, const Placements& placements, Async async,
                                            std::optional<Device> device) {
  DTR_CHECK(!tensors.empty(), ValueError, "redistribute_coalesced: no tensors given");
  std::vector<DTensorSpec> specs;
  std::vector<Tensor> locals;
  bool moves = false;  // a local changes device
  for (const DTensor& t : tensors) {
    specs.push_back(t.spec());
    locals.push_back(t.to_local());
    moves = moves || (device && locals.back().device() != *device);
    DTR_CHECK(!device || locals.back().device() == locals.front().device(), ValueError,
              "redistribute_coalesced: to {} on {}: sources on {} and {}; moving to a device needs the sources on "
              "one device",
              placements_str(placements), *device, locals.front().device(), locals.back().device());
  }
  const Device home = locals.front().device();
  RedistributePlan plan = plan_redistribute_coalesced(specs, placements);
  std::vector<DTensor> out;
  if (plan.steps().empty() && !moves) {
    for (const DTensor& t : tensors) out.push_back(t);
    return out;
  }
  if (KeptOutputs::in_scope()) {  // a selectively checkpointed forward keeps the results: synchronous
    const std::vector<Tensor> moved = kept_or_computed(
        "redistribute", [&] { return PendingRedistribute(std::move(plan), std::move(locals), device).wait(); });
    for (size_t i = 0; i < specs.size(); ++i) out.emplace_back(moved[i], specs[i].with_placements(placements));
  } else {
    auto pending = std::make_shared<PendingRedistribute>(std::move(plan), std::move(locals), device);
    if (async == Async::kNo) pending->wait();
    for (size_t i = 0; i < specs.size(); ++i) {
      DTensorSpec target = specs[i].with_placements(placements);
      if (async == Async::kNo) {
        out.emplace_back(pending->wait()[i], std::move(target));
      } else {
        auto impl = std::make_shared<DTensor::Impl>();
        impl->spec = std::move(target);
        impl->pending = pending;
        impl->pending_index = i;
        out.push_back(DTensor(std::move(impl)));
      }
    }
  }
  // Backward: each gradient goes back to the source placements, Partial ones becoming
  // Replicate (a Partial input's gradient is the same on every rank: PyTorch's rule).
  Placements back = specs.front().placements();
  for (Placement& p : back) {
    if (p.is_partial()) {
      DTR_CHECK(is_linear(p.reduce_op()) || !needs_grad(tensors), NotImplementedError,
                "redistribute: differentiating through {} -> {} is not supported (a Partial({}) term's gradient "
                "is not defined without the reduced value); reduce it outside autograd",
                placements_str(specs.front().placements()), placements_str(placements), reduce_op_name(p.reduce_op()));
      p = Replicate();
    }
  }
  const std::optional<Device> back_to = device ? std::optional(home) : std::nullopt;
  record("redistribute", tensors, out, [back, back_to](const std::vector<DTensor>& grads) {
    std::vector<DTensor> moved;
    bool same = true;
    for (const DTensor& g : grads) same = same && g.placements() == grads.front().placements();
    if (same) return redistribute_coalesced(grads, back, Async::kNo, back_to);
    for (const DTensor& g : grads) moved.push_back(redistribute_coalesced({&g, 1}, back, Async::kNo, back_to).front());
    return moved;
  });
  return out;
}

std::vector<DTensor> redistribute_grouped(std::span<const DTensor> tensors, std::span<const Placements> targets,
                                          Async async, std::optional<Device> device) {
  DTR_CHECK(tensors.size() == targets.size(), ValueError, "redistribute_grouped: {} tensors but {} targets",
            tensors.size(), targets.size());
  std::vector<DTensor> out(tensors.size());
  std::vector<bool> done(tensors.size(), false);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (done[i]) continue;
    std::vector<size_t> same;
    std::vector<DTensor> batch;
    for (size_t j = i; j < tensors.size(); ++j) {
      if (!done[j] && tensors[j].mesh() == tensors[i].mesh() && tensors[j].placements() == tensors[i].placements() &&
          targets[j] == targets[i]) {
        same.push_back(j);
        batch.push_back(tensors[j]);
        done[j] = true;
      }
    }
    std::vector<DTensor> moved = redistribute_coalesced(batch, targets[i], async, device);
    for (size_t k = 0; k < same.size(); ++k) out[same[k]] = std::move(moved[k]);
  }
  return out;
}

DTensor distribute_tensor(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  DTensorSpec replicated(mesh, Placements(mesh.ndim(), Replicate()), full.shape(), full.dtype());
  DTensorSpec target = replicated.with_placements(placements);  // validates before any communication
  // The source's dtype and shape first (padded to a fixed length), so that a mismatch is
  // an error rather than a broken broadcast.
  constexpr int64_t kMaxDims = 16;
  DTR_CHECK(full.dim() <= kMaxDims, ValueError, "distribute_tensor: {} has more than {} dims", describe(full),
            kMaxDims);
  std::vector<int64_t> header(kMaxDims + 2, -1);
  header[0] = static_cast<int64_t>(full.dtype());
  header[1] = full.dim();
  std::copy(full.shape().begin(), full.shape().end(), header.begin() + 2);
  // Collectives take no bool: a bool tensor is broadcast as int32 0/1. The result lives on
  // the mesh's device, as in PyTorch.
  Tensor data = (full.dtype() == kBool ? full.to(kInt32) : full).contiguous().clone().to(mesh.device());
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (mesh.size(m) == 1) continue;
    Tensor source = Tensor::from_vector(header).to(mesh.device());
    mesh.group(m).broadcast(source, 0).wait();
    source = source.to(kCPU);
    const int64_t* s = source.data_ptr<int64_t>();
    DTR_CHECK(std::equal(header.begin(), header.end(), s), ValueError,
              "distribute_tensor: rank {} passed {} but the source rank (coordinate 0 of {}) passed {}{}; every rank "
              "must pass a tensor of the same shape and dtype",
              mesh.this_rank(), describe(full), mesh.to_string(), dtype_name(static_cast<DType>(s[0])),
              Shape(s + 2, s + 2 + s[1]));
    mesh.group(m).broadcast(data, 0).wait();
  }
  RedistributePlan plan = plan_redistribute(replicated, placements);
  return DTensor(execute_redistribute(plan, {data.to(full.dtype())}).front(), std::move(target));
}

DTensor from_local(const Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                   std::optional<Shape> shape, RunCheck run_check) {
  DTR_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), ValueError,
            "from_local: {} placements {} for a {}-d mesh {}; give one placement per mesh dim", placements.size(),
            placements_str(placements), mesh.ndim(), mesh.to_string());
  Shape global = shape.value_or(local.shape());
  if (!shape) {
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      if (placements[m].splits_a_dim()) {
        const int64_t d = wrap_dim(placements[m].shard_dim(), local.dim(), "from_local");
        global[d] *= mesh.size(m);
      }
    }
  }
  DTensorSpec spec(mesh, placements, global, local.dtype());
  if (run_check == RunCheck::kYes) {
    const auto all = all_gather_mesh(mesh, {local.dim(), static_cast<int64_t>(local.dtype())});
    for (int64_t r = 0; r < mesh.size(); ++r) {
      DTR_CHECK(all[r] == all[0], ValueError,
                "from_local: ranks {} and {} of {} pass local tensors of different rank or dtype ({}-d {} vs {}-d "
                "{})",
                mesh.ranks()[0], mesh.ranks()[r], mesh.to_string(), all[0][0],
                dtype_name(static_cast<DType>(all[0][1])), all[r][0], dtype_name(static_cast<DType>(all[r][1])));
    }
    const auto shapes = all_gather_mesh(mesh, local.shape());
    for (int64_t r = 0; r < mesh.size(); ++r) {
      const Shape expected = spec.local_shape(mesh.coordinate_at(r));
      DTR_CHECK(shapes[r] == expected, ValueError,
                "from_local: rank {} holds a local tensor of shape {} but {} of global shape {} gives it {}{}",
                mesh.ranks()[r], shapes[r], describe_placements_on(mesh, placements), global, expected,
                shape ? "" : " (shards look uneven: pass the global shape)");
    }
  }
  return DTensor(local, std::move(spec));
}

}  // namespace dtr
