// DTensor: a global tensor on a device mesh = this rank's local Tensor + a DTensorSpec
// (PyTorch's torch.distributed.tensor.DTensor), and its autograd state.
//
// The spec says what every rank holds (placements, global shape, dtype); the local tensor
// holds this rank's part, of shape spec().local_shape(). Data moves between ranks only
// in redistribute (and in distribute_tensor / from_local's check), one collective per plan
// step; an asynchronous redistribute returns a pending DTensor at once, and the first
// to_local() waits. A DTensor is a handle: copies share one tensor (data, grad, grad_fn), as
// torch Tensors do. Locals are values: an op writes into a local only where nothing else
// holds it (DTensor::is_sole_owner: relu_, add_, relu's backward), so no one sees it change.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dtensor/dtensor_spec.h"
#include "dtensor/redistribute.h"

namespace dtr {

class Node;
enum class RetainGraph : uint8_t { kNo, kYes };

class DTensor {
 public:
  DTensor() = default;
  // Wraps a local tensor under a spec; ValueError if its shape or dtype is not what the
  // spec gives this rank.
  DTensor(Tensor local, DTensorSpec spec);

  bool defined() const { return impl_ != nullptr; }
  const DTensorSpec& spec() const;
  const DeviceMesh& mesh() const { return spec().mesh(); }
  const Placements& placements() const { return spec().placements(); }
  const Shape& shape() const { return spec().shape(); }
  int64_t size(int64_t dim) const { return shape()[wrap_dim(dim, this->dim(), "size")]; }
  DType dtype() const { return spec().dtype(); }
  int64_t dim() const { return spec().ndim(); }
  int64_t numel() const { return shape_numel(shape()); }
  // Whether an asynchronous redistribute producing this tensor is still in flight.
  bool is_pending() const;
  // The same DTensor object (not merely equal values).
  bool is_same(const DTensor& other) const { return impl_ == other.impl_; }
  // The object's identity, equal exactly for handles is_same holds for (null when
  // undefined): a key for sets of DTensor objects.
  const void* identity() const { return impl_.get(); }
  // Whether nothing but this handle can read its data: no other handle to this DTensor, no
  // other tensor or view on its local storage, no redistribute in flight. An op may then
  // overwrite it in place (the autograd engine hands a gradient to one backward function,
  // which may reuse it: relu's does).
  bool is_sole_owner() const;

  // This rank's part (waits for a pending redistribute first).
  const Tensor& to_local() const;
  // The whole tensor on every rank (redistribute to Replicate everywhere; differentiable
  // through redistribute when called on a tensor that requires grad).
  Tensor full_tensor() const;
  // The value of a one-element tensor on every rank (Partial placements reduced first).
  double item() const;
  // The same tensor under other placements on the same mesh (cross-mesh moves are not
  // supported: ValueError). Async::kYes returns a pending DTensor. Differentiable: the
  // gradient moves back to the source placements, a Partial source's as Replicate (the
  // backward recorded by redistribute_coalesced, below, in dtensor/dtensor.cc).
  DTensor redistribute(const Placements& placements, Async async = Async::kNo) const;
  DTensor redistribute(const DeviceMesh& mesh, const Placements& placements, Async async = Async::kNo) const;

  // --- autograd (dtensor/autograd.h runs it) ---
  bool requires_grad() const;
  // Makes this leaf require (or stop requiring) a gradient; returns *this. ValueError on a
  // non-leaf (a tensor an op produced: detach() it first).
  DTensor& requires_grad_(bool requires_grad = true);
  bool is_leaf() const;
  // The accumulated gradient of a leaf (undefined before backward or after zero_grad).
  const DTensor& grad() const;
  void set_grad(DTensor grad) const;
  // The node that produced this tensor (null for leaves and for tensors made without grad).
  const std::shared_ptr<Node>& grad_fn() const;
  // Backpropagates from this tensor: with no gradient it must hold one element (the loss).
  void backward(DTensor gradient = {}, RetainGraph retain_graph = RetainGraph::kNo) const;
  // A new tensor on the same data that no graph records.
  DTensor detach() const;
  // Calls hook(grad) whenever a gradient for this tensor is computed; a defined result
  // replaces the gradient. Hooks run in the order they were registered. Returns an id for
  // remove_hook, unique in the process.
  int register_hook(std::function<DTensor(const DTensor&)> hook) const;
  // Removes this tensor's hook `id`: it is not called again, the tensor's other hooks still
  // are. An id already removed, or one this tensor did not return, changes nothing (as
  // PyTorch's RemovableHandle.remove() may be called twice).
  void remove_hook(int id) const;
  // Leaves only: calls hook(*this) after a gradient was accumulated into grad() (FSDP's
  // reduce-scatter trigger; torch's register_post_accumulate_grad_hook).
  void register_post_accumulate_grad_hook(std::function<void(const DTensor&)> hook) const;
  // Leaves only: the placements grad() is kept in (default: the leaf's own, so a Partial
  // gradient of a Replicate parameter is all-reduced as it accumulates, and one of a
  // Shard(0) parameter reduce-scattered). Give Partial placements to keep gradients
  // unreduced (gradient accumulation without sync).
  void set_grad_placements(Placements placements) const;

  // "DTensor(float32[8, 6] (S(0), R) on DeviceMesh(...), local float32[4, 6])".
  std::string to_string() const;

  // The shared state a handle points to (dtensor/internal/dtensor_impl.h).
  struct Impl;

 private:
  friend class Node;
  friend struct AutogradAccess;
  friend std::vector<DTensor> redistribute_coalesced(std::span<const DTensor>, const Placements&, Async,
                                                     std::optional<Device>);
  explicit DTensor(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Impl& impl() const;

  std::shared_ptr<Impl> impl_;
};

// Distributes `full` (read on the mesh's coordinate-0 rank, broadcast to the others along
// each mesh dim) under `placements`: every rank keeps its chunk.
DTensor distribute_tensor(const Tensor& full, const DeviceMesh& mesh, const Placements& placements);

enum class RunCheck : uint8_t { kNo, kYes };

// Wraps each rank's `local` as its part of a DTensor. The global shape is inferred for
// even sharding (local size times the mesh dims sharding each tensor dim); give `shape`
// when shards are uneven. With RunCheck::kYes (the default) every rank's local shape,
// dtype and the inferred global shape are compared across the mesh (a small all_gather
// per mesh dim): a disagreement is a ValueError naming the ranks, shapes and placements.
DTensor from_local(const Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                   std::optional<Shape> shape = std::nullopt, RunCheck run_check = RunCheck::kYes);

// Redistributes several DTensors making the same move (same mesh and source placements)
// with one collective per plan step for all of them (FSDP's parameter all-gather).
// Differentiable like redistribute; the backward of a coalesced move is coalesced too.
// `device` puts the results' locals there (FSDP's CPU offload: reduced gradients go to the
// host); the sources must then share one device, to which the backward's gradients go.
std::vector<DTensor> redistribute_coalesced(std::span<const DTensor> tensors, const Placements& placements,
                                            Async async = Async::kNo, std::optional<Device> device = std::nullopt);

// tensors[i] moved to targets[i]: one redistribute_coalesced per distinct (mesh, source
// placements, target) in order of first appearance (the same on every rank, given the same
// lists), the results in the tensors' order (FSDP's groups and DDP's buckets, whose
// parameters tensor parallelism may place apart).
std::vector<DTensor> redistribute_grouped(std::span<const DTensor> tensors, std::span<const Placements> targets,
                                          Async async = Async::kNo, std::optional<Device> device = std::nullopt);

}  // namespace dtr
