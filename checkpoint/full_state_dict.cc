#include "checkpoint/full_state_dict.h"

#include <map>

#include "nn/parameter.h"

namespace dtr::checkpoint {

TensorMap full_state_dict(nn::Module& module) {
  TensorMap out;
  for (const auto& [name, value] : module.state_dict()) out.emplace(name, value.full_tensor().to(kCPU));
  return out;
}

nn::LoadResult load_full_state_dict(nn::Module& module, const TensorMap& tensors, nn::Strict strict) {
  std::map<std::string, DTensorSpec> specs;
  for (const auto& [name, value] : module.state_dict()) specs.emplace(name, value.spec());
  nn::StateDict state;
  for (const auto& [name, full] : tensors) {
    const auto it = specs.find(name);
    if (it != specs.end() && full.shape() == it->second.shape()) {
      // This rank's chunk, under the module's spec in the file's dtype (a dtype mismatch is
      // reported by load_state_dict).
      const DTensorSpec spec(it->second.mesh(), it->second.placements(), full.shape(), full.dtype());
      const Tensor chunk = ranges_of(full, spec.local_ranges()).contiguous();
      state.emplace_back(name, DTensor(chunk.to(spec.mesh().device()), spec));
    } else {
      // Unexpected, or of the wrong shape: a one-rank tensor carries the name and shape for the report.
      const DeviceMesh mesh = single_rank_mesh();
      state.emplace_back(name, DTensor(full, DTensorSpec(mesh, {Replicate()}, full.shape(), full.dtype())));
    }
  }
  return module.load_state_dict(state, strict);
}

}  // namespace dtr::checkpoint
