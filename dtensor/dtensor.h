// DTensor: a global tensor on a device mesh = this rank's local Tensor + a DTensorSpec
// (PyTorch's torch.distributed.tensor.DTensor).
//
// The spec says what every rank holds (placements, global shape, dtype); the local
// tensor holds this rank's part, of shape spec().local_box().shape. Data moves between
// ranks only in redistribute (and in distribute_tensor / from_local's check), one
// collective per plan step. An asynchronous redistribute returns at once with a pending
// DTensor: its collective runs while the caller computes, and the first to_local() waits.
// Local tensors are never written by dtr after creation; treat them as values.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtensor/dtensor_spec.h"
#include "dtensor/redistribute.h"
#include "kernels/tensor.h"

namespace dtr {

class DTensor {
 public:
  DTensor() = default;
  // Wraps a local tensor under a spec; ValueError if its shape, dtype or device is not
  // what the spec gives this rank.
  DTensor(Tensor local, DTensorSpec spec);

  bool defined() const { return spec_.has_value(); }
  const DTensorSpec& spec() const;
  const DeviceMesh& mesh() const { return spec().mesh(); }
  const Placements& placements() const { return spec().placements(); }
  const Shape& shape() const { return spec().shape(); }
  DType dtype() const { return spec().dtype(); }
  int64_t dim() const { return spec().ndim(); }
  // Whether an asynchronous redistribute producing this tensor is still in flight.
  bool is_pending() const { return pending_ != nullptr; }

  // This rank's part (waits for a pending redistribute first).
  const Tensor& to_local() const;
  // The whole tensor on every rank (redistribute to Replicate everywhere).
  Tensor full_tensor() const;
  // The same tensor under other placements on the same mesh (cross-mesh moves are not
  // supported: ValueError). Async::kYes returns a pending DTensor.
  DTensor redistribute(const Placements& placements, Async async = Async::kNo) const;
  DTensor redistribute(const DeviceMesh& mesh, const Placements& placements, Async async = Async::kNo) const;

  // "DTensor(float32[8, 6] (S(0), R) on DeviceMesh(...), local float32[4, 6])".
  std::string to_string() const;

 private:
  friend std::vector<DTensor> redistribute_coalesced(std::span<const DTensor>, const Placements&, Async);
  DTensor(std::shared_ptr<PendingRedistribute> pending, size_t index, DTensorSpec spec);

  mutable Tensor local_;
  std::optional<DTensorSpec> spec_;
  mutable std::shared_ptr<PendingRedistribute> pending_;
  size_t pending_index_ = 0;
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
std::vector<DTensor> redistribute_coalesced(std::span<const DTensor> tensors, const Placements& placements,
                                            Async async = Async::kNo);

}  // namespace dtr
