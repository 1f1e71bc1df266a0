#include "kernels/cuda/fill_copy.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/internal/launch.h"

namespace dtr::cuda {
namespace {

using internal::blocks_for;
using internal::kThreads;

template <class T>
__global__ void fill_kernel(T* dst, int64_t n, T value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = value;
  }
}

template <class To, class From>
__global__ void cast_kernel(To* dst, const From* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = convert<To>(src[i]);
  }
}

}  // namespace

void fill(void* dst, DType dtype, int64_t n, double value, int device, cudaStream_t stream) {
  if (n == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_all(dtype, "cuda fill", [&]<class T>(TypeTag<T>) {
    fill_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(dst), n, convert<T>(value));
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, int device, cudaStream_t stream) {
  if (n == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_all(dst_dtype, "cuda cast", [&]<class To>(TypeTag<To>) {
    dispatch_all(src_dtype, "cuda cast", [&]<class From>(TypeTag<From>) {
      cast_kernel<To, From>
          <<<blocks_for(n), kThreads, 0, stream>>>(static_cast<To*>(dst), static_cast<const From*>(src), n);
    });
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
