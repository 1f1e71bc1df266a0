// safetensors: full state dicts on disk in the .safetensors format, as Python's
// safetensors library writes and reads them (the format and its checks:
// checkpoint/safetensors_header.h). load_file also refuses a BOOL byte other than 0 or 1.
#pragma once

#include <map>
#include <string>

#include "checkpoint/safetensors_header.h"
#include "core/tensor.h"

namespace dtr {

// Tensors by name: a full (unsharded) state dict.
using TensorMap = std::map<std::string, Tensor>;

}  // namespace dtr

namespace dtr::safetensors {

// Writes `tensors` (CPU tensors of the seven dtypes; views are copied contiguous) to
// `path`, largest element size first so every tensor starts aligned, through a temporary
// file renamed over `path` once complete: a failed save leaves an existing file intact.
void save_file(const TensorMap& tensors, const std::string& path, const SafetensorsMetadata& metadata = {});

// Reads every tensor of `path` onto the CPU; `metadata`, when given, receives __metadata__.
TensorMap load_file(const std::string& path, SafetensorsMetadata* metadata = nullptr);

}  // namespace dtr::safetensors
