#include "core/cuda/fill_copy.h"

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/cuda/map_index.cuh"

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

template <class T>
__global__ void arange_kernel(T* dst, int64_t n, double start, double step) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = convert<T>(fma(static_cast<double>(i), step, start));
  }
}

template <class To, class From>
__global__ void cast_kernel(To* dst, const From* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = convert<To>(src[i]);
  }
}

template <class To, class From>
__global__ void strided_cast_kernel(MapOperand dst, MapOperand src, MapShape shape) {
  const MapOperand* const operands[] = {&dst, &src};
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < shape.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    internal::map_offsets(shape, operands, i, off);
    static_cast<To*>(dst.data)[off[0]] = convert<To>(static_cast<const From*>(src.data)[off[1]]);
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

void arange(void* dst, DType dtype, int64_t n, double start, double step, int device, cudaStream_t stream) {
  if (n == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_numeric(dtype, "cuda arange", [&]<class T>(TypeTag<T>) {
    arange_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(dst), n, start, step);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void copy(const MapOperand& dst, DType dst_dtype, const MapOperand& src, DType src_dtype, const MapShape& shape,
          int device, cudaStream_t stream) {
  if (shape.numel == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  const bool flat = contiguous_over(dst, shape) && contiguous_over(src, shape);
  dispatch_all(dst_dtype, "cuda copy", [&]<class To>(TypeTag<To>) {
    dispatch_all(src_dtype, "cuda copy", [&]<class From>(TypeTag<From>) {
      if (flat) {
        cast_kernel<To, From><<<blocks_for(shape.numel), kThreads, 0, stream>>>(
            static_cast<To*>(dst.data), static_cast<const From*>(src.data), shape.numel);
      } else {
        strided_cast_kernel<To, From><<<blocks_for(shape.numel), kThreads, 0, stream>>>(dst, src, shape);
      }
    });
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
