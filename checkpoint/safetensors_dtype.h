// The dtype codes of the safetensors format ("F32", "BF16", "BOOL", ...) for the dtypes dtr
// stores: nn's safetensors files and dtensor's checkpoint shards both use them.
#pragma once

#include <optional>
#include <string_view>

#include "core/dtype.h"

namespace dtr {

// The code of `dtype` (every dtr dtype has one).
std::string_view safetensors_dtype(DType dtype);
// The dtype of a code, or nullopt for one dtr does not read.
std::optional<DType> dtype_from_safetensors(std::string_view code);

}  // namespace dtr
