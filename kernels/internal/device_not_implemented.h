// The error every Tensor-level op raises for a device whose kernels do not exist yet.
//
// Each op dispatches on device in one visible switch; until its CUDA kernel lands, the
// kCUDA case calls this, which throws NotImplementedError naming the op, the device and
// the operands ("add: not implemented for cuda:0 tensors yet (got float32[2, 3],
// float32[3]); run it on CPU tensors"). It is the only such helper: ops do not format their
// own variants of this message.
#pragma once

#include <string_view>

#include "core/device.h"

namespace dtr {

// Throws NotImplementedError "<op>: not implemented for <device> tensors yet (got <operands>)".
[[noreturn]] void throw_device_not_implemented(std::string_view op, Device device, std::string_view operands);

}  // namespace dtr
