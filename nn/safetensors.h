// safetensors: full state dicts on disk in the .safetensors format, as Python's
// safetensors library writes and reads them (the format and its checks:
// kernels/safetensors_header.h). load_file also refuses a BOOL byte other than 0 or 1.
#pragma once

#include <map>
#include <string>

#include "kernels/safetensors_header.h"
#include "kernels/tensor.h"

namespace dtr::nn {

// Tensors by name: a full (unsharded) state dict.
using TensorMap = std::map<std::string, Tensor>;

// Writes `tensors` (CPU tensors of the seven dtypes; views are copied contiguous) to
// `path`, largest element size first so every tensor starts aligned, through a temporary
// file renamed over `path` once complete: a failed save leaves an existing file intact.
void save_file(const TensorMap& tensors, const std::string& path, const SafetensorsMetadata& metadata = {});

// Reads every tensor of `path` onto the CPU; `metadata`, when given, receives __metadata__.
TensorMap load_file(const std::string& path, SafetensorsMetadata* metadata = nullptr);

}  // namespace dtr::nn
