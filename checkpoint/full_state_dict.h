// Full state dicts: every parameter and persistent buffer as a whole CPU tensor, the form
// .safetensors files hold (PyTorch's get_model_state_dict with full_state_dict=True).
#pragma once

#include "checkpoint/safetensors.h"
#include "nn/module.h"

namespace dtr::checkpoint {

// Each entry's full tensor (a collective for sharded or Partial entries: every rank calls).
TensorMap full_state_dict(nn::Module& module);

// Loads whole tensors: every rank takes its own chunk of each (no communication), then
// nn::Module::load_state_dict checks and copies as usual (same errors, same Strict).
nn::LoadResult load_full_state_dict(nn::Module& module, const TensorMap& tensors, nn::Strict strict = nn::Strict::kYes);

}  // namespace dtr::checkpoint
