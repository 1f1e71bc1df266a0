// DTR_CUDA_CHECK(call, device): one check for every CUDA runtime call.
//
// On failure it throws dtr::CudaError naming the call, the device and CUDA's own
// error string (cudaGetErrorString), as every library failure in dtr is reported.
// Usable from .cu files: the message is built in cuda_device.cc, not here.
#pragma once

#include <cuda_runtime_api.h>

namespace dtr::cuda {

[[noreturn]] void throw_cuda_error(const char* call, int device, cudaError_t status);

}  // namespace dtr::cuda

#define DTR_CUDA_CHECK(call, device)                                    \
  do {                                                                  \
    cudaError_t dtr_cuda_status_ = (call);                              \
    if (dtr_cuda_status_ != cudaSuccess) [[unlikely]] {                 \
      ::dtr::cuda::throw_cuda_error(#call, (device), dtr_cuda_status_); \
    }                                                                   \
  } while (0)
