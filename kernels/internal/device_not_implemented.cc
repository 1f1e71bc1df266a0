#include "kernels/internal/device_not_implemented.h"

#include "core/error.h"

namespace dtr {

void throw_device_not_implemented(std::string_view op, Device device, std::string_view operands) {
  throw NotImplementedError(
      fmt::format("{}: not implemented for {} tensors yet (got {}); run it on CPU tensors", op, device, operands));
}

}  // namespace dtr
