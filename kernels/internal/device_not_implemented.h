// The error a Tensor-level op raises for a device whose kernels do not exist yet.
//
// Ops dispatch on device in one visible switch; until a CUDA kernel lands, that case
// calls this, which throws NotImplementedError naming the op, the device and the operands.
#pragma once

#include <string_view>

#include "kernels/device.h"

namespace dtr {

[[noreturn]] void throw_device_not_implemented(std::string_view op, Device device, std::string_view operands);

}  // namespace dtr
