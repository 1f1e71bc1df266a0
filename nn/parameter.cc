#include "nn/parameter.h"

#include "kernels/fill.h"

namespace dtr::nn {

DTensor empty_parameter(const Shape& shape, const ParameterOptions& options) {
  const DeviceMesh mesh = options.mesh ? *options.mesh : single_rank_mesh();
  const DTensorSpec spec(mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate()), shape, options.dtype);
  return DTensor(Tensor::empty(shape, options.dtype, mesh.device()), spec);
}

DTensor partial_grad(const DTensor& param) {
  const DTensor& g = param.grad();
  if (!g.defined()) {
    const DTensorSpec spec = param.spec().with_placements({Partial()});
    return DTensor(zeros(spec.local_shape(), spec.dtype(), spec.mesh().device()), spec);
  }
  return g.placements() == Placements{Partial()} ? g : g.redistribute({Partial()});
}

DTensor distribute_parameter(const DTensor& full, const DeviceMesh& mesh, const Placements& placements, Device device) {
  DTensorSpec spec(mesh, placements, full.shape(), full.dtype());
  const Tensor chunk = ranges_of(full.to_local(), spec.local_ranges());
  Tensor local = Tensor::empty(chunk.shape(), chunk.dtype(), device);
  local.copy_(chunk);
  DTensor placed(std::move(local), std::move(spec));
  placed.requires_grad_(full.requires_grad());
  return placed;
}

}  // namespace dtr::nn
