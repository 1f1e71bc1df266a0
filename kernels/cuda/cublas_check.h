// DTR_CUBLAS_CHECK(call, device): the cuBLAS(Lt) member of the check family of
// cuda_check.h: on failure it throws CudaError naming the call, the device and cuBLASLt's
// own status string.
#pragma once

#include <cublasLt.h>

namespace dtr::cuda {

[[noreturn]] void throw_cublas_error(const char* call, int device, cublasStatus_t status);

}  // namespace dtr::cuda

#define DTR_CUBLAS_CHECK(call, device)                                      \
  do {                                                                      \
    cublasStatus_t dtr_cublas_status_ = (call);                             \
    if (dtr_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {         \
      ::dtr::cuda::throw_cublas_error(#call, (device), dtr_cublas_status_); \
    }                                                                       \
  } while (0)
