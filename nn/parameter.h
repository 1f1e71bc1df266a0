// Where a layer creates its parameters: dtype and mesh (PyTorch's device= and dtype=
// factory arguments). Parameters start Replicate on the mesh; fully_shard moves them.
#pragma once

#include <optional>

#include "dtensor/dtensor.h"

namespace dtr::nn {

struct ParameterOptions {
  DType dtype = kFloat32;
  // Default: single_rank_mesh() (dtensor/device_mesh.h), for models that run in one process.
  std::optional<DeviceMesh> mesh = std::nullopt;
};

// A Replicate DTensor of `shape` on the options' mesh, uninitialised (an init function fills it).
DTensor empty_parameter(const Shape& shape, const ParameterOptions& options);

// This rank's chunk of the parameter `full` under `placements` on `mesh`, taken from its
// local value without communication (every rank built the same model), as a new leaf that
// owns its memory on `device` and requires grad as `full` does (so the whole tensor can be
// freed): how fully_shard and parallelize_module place a model as built. `full` is
// Replicate (its local value is the whole tensor), or placed on a mesh whose dims `mesh`
// begins with, under the placements `placements` begins with (tensor parallelism's piece,
// which the other dims chunk further: fully_shard of a tensor-parallel model); ValueError
// otherwise.
DTensor distribute_parameter(const DTensor& full, const DeviceMesh& mesh, const Placements& placements, Device device);

// The gradient of `param` under `partial` (its placements with Partial on the mesh dims its
// gradients are summed over; a local move): its grad, or zeros when this rank's backward did
// not reach it, so that every rank reduces the same tensors (replicate's buckets, sequence
// parallelism's norms).
DTensor partial_grad(const DTensor& param, const Placements& partial);

// Whether `param` was placed by tensor parallelism on a sub-mesh of the root that the data-
// parallel mesh `data` was cut from, over other dims (mesh["tp"] beside mesh["dp"]): what
// fully_shard and replicate take beside Replicate parameters. ValueError naming `what` (the
// parameter) for one on that root that overlaps `data` or holds a Partial.
bool is_tensor_parallel(const DTensor& param, const DeviceMesh& data, const std::string& what);

// The root mesh's dims `first`'s, then `then`'s: the tp-first view (tp, dp), whose placements
// nest tp first, so FSDP chunks each rank's tensor-parallel piece; and the compute mesh
// (dp, tp), where the batch is split over dp and a data-parallel module runs.
DeviceMesh joined_mesh(const DeviceMesh& first, const DeviceMesh& then);

}  // namespace dtr::nn
