// Where a layer creates its parameters: dtype and mesh (PyTorch's device= and dtype=
// factory arguments). Parameters start Replicate on the mesh; fully_shard moves them.
#pragma once

#include <optional>

#include "dtensor/dtensor.h"

namespace dtr::nn {

struct ParameterOptions {
  DType dtype = kFloat32;
  // Default: a one-rank CPU mesh, for models that run in one process.
  std::optional<DeviceMesh> mesh = std::nullopt;
};

// The one-rank CPU mesh layers use by default.
DeviceMesh single_rank_mesh();

// A Replicate DTensor of `shape` on the options' mesh, uninitialised (an init function fills it).
DTensor empty_parameter(const Shape& shape, const ParameterOptions& options);

}  // namespace dtr::nn
