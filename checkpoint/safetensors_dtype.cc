#include "checkpoint/safetensors_dtype.h"

#include <array>
#include <utility>

#include "core/error.h"

namespace dtr {
namespace {

constexpr std::array<std::pair<DType, std::string_view>, 7> kCodes = {{
    {kFloat32, "F32"},
    {kFloat64, "F64"},
    {kBFloat16, "BF16"},
    {kFloat16, "F16"},
    {kInt32, "I32"},
    {kInt64, "I64"},
    {kBool, "BOOL"},
}};

}  // namespace

std::string_view safetensors_dtype(DType dtype) {
  for (const auto& [d, code] : kCodes) {
    if (d == dtype) return code;
  }
  DTR_INTERNAL_ASSERT(false, "no safetensors code for {}", dtype_name(dtype));
  return {};
}

std::optional<DType> dtype_from_safetensors(std::string_view code) {
  for (const auto& [d, c] : kCodes) {
    if (c == code) return d;
  }
  return std::nullopt;
}

}  // namespace dtr
