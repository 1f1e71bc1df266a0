// launch: the device switch of the ops whose kernels exist so far only for the CPU
// (elementwise and reductions).
//
// launch(op, out, cpu_kernel) runs cpu_kernel(out) for a CPU output. For a CUDA output it
// throws NotImplementedError naming the op and the tensor: the CUDA kernels of these ops
// are a later step of the roadmap, and until then this typed error (not a stub) tells
// the caller to move the tensors to the CPU. Inputs share out's device (checked by the op).
#pragma once

#include <string_view>

#include "kernels/error.h"
#include "kernels/tensor.h"

namespace dtr::internal {

template <class CpuKernel>
void launch(std::string_view op, const Tensor& out, const CpuKernel& cpu_kernel) {
  switch (out.device().type) {
    case kCPU:
      cpu_kernel(out);
      return;
    case kCUDA:
      throw NotImplementedError(fmt::format(
          "{}: not implemented for CUDA tensors yet (output {}); move the operands to the CPU with .to(kCPU)", op,
          describe(out)));
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type {}", static_cast<int>(out.device().type));
}

}  // namespace dtr::internal
