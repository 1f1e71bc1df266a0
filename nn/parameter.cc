#include "nn/parameter.h"

namespace dtr::nn {

DTensor empty_parameter(const Shape& shape, const ParameterOptions& options) {
  const DeviceMesh mesh = options.mesh ? *options.mesh : single_rank_mesh();
  const DTensorSpec spec(mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate()), shape, options.dtype);
  return DTensor(Tensor::empty(shape, options.dtype, mesh.device()), spec);
}

}  // namespace dtr::nn
