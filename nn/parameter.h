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

}  // namespace dtr::nn
