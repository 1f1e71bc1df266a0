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

// The gradient of `param`, a parameter on a 1-D mesh whose gradients are summed over it, as
// Partial (a local move): its grad, or zeros when this rank's backward did not reach it, so
// that every rank reduces the same tensors (replicate's buckets, sequence parallelism's norms).
DTensor partial_grad(const DTensor& param);

}  // namespace dtr::nn
