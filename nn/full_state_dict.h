// Full state dicts: every parameter and persistent buffer as a whole CPU tensor, the form
// .safetensors files hold (PyTorch's get_model_state_dict with full_state_dict=True).
#pragma once

#include "nn/module.h"
#include "nn/safetensors.h"

namespace dtr::nn {

// Each entry's full tensor (a collective for sharded or Partial entries: every rank calls).
TensorMap full_state_dict(Module& module);

// Loads whole tensors: every rank takes its own chunk of each (no communication), then
// Module::load_state_dict checks and copies as usual (same errors, same Strict).
LoadResult load_full_state_dict(Module& module, const TensorMap& tensors, Strict strict = Strict::kYes);

}  // namespace dtr::nn
