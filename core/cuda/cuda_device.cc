#include "core/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include <cstdio>

#include "core/cuda/cuda_check.h"
#include "core/error.h"

namespace dtr::cuda {

void throw_cuda_error(const char* call, int device, cudaError_t status) {
  throw CudaError(
      fmt::format("{} failed on cuda:{}: {} ({})", call, device, cudaGetErrorString(status), static_cast<int>(status)));
}

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clears "insufficient driver" / "no device": a CPU-only machine
      return 0;
    }
    return n;
  }();
  return count;
}

std::string device_description(int device) {
  cudaDeviceProp p{};
  DTR_CUDA_CHECK(cudaGetDeviceProperties(&p, device), device);
  return fmt::format("{}, {:.1f} GiB, sm_{}{}", p.name, static_cast<double>(p.totalGlobalMem) / (1 << 30), p.major,
                     p.minor);
}

void* device_malloc(int device, size_t nbytes) {
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, nbytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so that later calls do not report it
    return nullptr;
  }
  DTR_CUDA_CHECK(status, device);
  return p;
}

void device_free(int device, void* ptr) noexcept {
  cudaError_t status = cudaSetDevice(device);
  const char* call = "cudaSetDevice";
  if (status == cudaSuccess) {
    status = cudaFree(ptr);
    call = "cudaFree";
  }
  if (status != cudaSuccess) {
    std::fprintf(stderr, "dtr: %s failed on cuda:%d while freeing %p: %s (%d); the memory is not returned\n", call,
                 device, ptr, cudaGetErrorString(status), static_cast<int>(status));
  }
}

}  // namespace dtr::cuda
