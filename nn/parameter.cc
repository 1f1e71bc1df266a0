#include "nn/parameter.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/fill.h"

namespace dtr::nn {

DTensor empty_parameter(const Shape& shape, const ParameterOptions& options) {
  const DeviceMesh mesh = options.mesh ? *options.mesh : single_rank_mesh();
  const DTensorSpec spec(mesh, Placements(static_cast<size_t>(mesh.ndim()), Replicate()), shape, options.dtype);
  return DTensor(Tensor::empty(shape, options.dtype, mesh.device()), spec);
}

DTensor partial_grad(const DTensor& param, const Placements& partial) {
  const DTensor& g = param.grad();
  if (!g.defined()) {
    const DTensorSpec spec = param.spec().with_placements(partial);
    return DTensor(zeros(spec.local_shape(), spec.dtype(), spec.mesh().device()), spec);
  }
  return g.placements() == partial ? g : g.redistribute(partial);
}

bool is_tensor_parallel(const DTensor& param, const DeviceMesh& data, const std::string& what) {
  const DeviceMesh& on = param.mesh();
  if (on == data || on.root_mesh() != data.root_mesh() || &on.root_mesh() == &on) return false;
  const std::vector<std::string>& names = data.dim_names();
  const bool disjoint = std::none_of(on.dim_names().begin(), on.dim_names().end(), [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  });
  DTR_CHECK(disjoint && !param.spec().has_partial(), ValueError,
            "{} is {}; a tensor-parallel parameter lives on a sub-mesh of {}'s root over other dims than the "
            "data-parallel mesh's, without Partial (parallelize_module on mesh[\"tp\"], then fully_shard or "
            "replicate on mesh[\"dp\"])",
            what, param.to_string(), data.to_string());
  return true;
}

DeviceMesh joined_mesh(const DeviceMesh& first, const DeviceMesh& then) {
  std::vector<std::string> names = first.dim_names();
  names.insert(names.end(), then.dim_names().begin(), then.dim_names().end());
  return first.root_mesh().submesh(names);
}

DTensor distribute_parameter(const DTensor& full, const DeviceMesh& mesh, const Placements& placements, Device device) {
  DTensorSpec spec(mesh, placements, full.shape(), full.dtype());
  // The mesh dims that chunk full's local value: all of them, or those after full's own.
  const int64_t lead = full.spec().is_replicated() ? 0 : full.mesh().ndim();
  std::vector<std::string> rest_names;
  if (lead > 0) {
    const std::vector<std::string>& names = mesh.dim_names();
    const bool nests = lead < mesh.ndim() && !names.empty() &&
                       mesh.submesh(std::vector<std::string>(names.begin(), names.begin() + lead)) == full.mesh() &&
                       std::equal(full.placements().begin(), full.placements().end(), placements.begin());
    DTR_CHECK(nests, ValueError,
              "distribute_parameter: {} is placed already; it can be chunked further on a mesh whose leading dims "
              "are its mesh's and whose leading placements are its own, not {} on {}",
              full.to_string(), placements_str(placements), mesh.to_string());
    rest_names.assign(names.begin() + lead, names.end());
  }
  const DTensorSpec within =
      lead == 0 ? spec
                : DTensorSpec(mesh.submesh(rest_names), Placements(placements.begin() + lead, placements.end()),
                              full.to_local().shape(), full.dtype());
  const Tensor chunk = ranges_of(full.to_local(), within.local_ranges());
  Tensor local = Tensor::empty(chunk.shape(), chunk.dtype(), device);
  local.copy_(chunk);
  DTensor placed(std::move(local), std::move(spec));
  placed.requires_grad_(full.requires_grad());
  return placed;
}

}  // namespace dtr::nn
