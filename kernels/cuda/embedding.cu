#include "kernels/cuda/embedding.h"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"

namespace dtr::cuda {
namespace {

using internal::blocks_for;
using internal::blocks_for_rows;
using internal::kThreads;

template <class T, class I>
__global__ void embedding_kernel(T* out, const T* weight, const I* indices, int64_t positions, int64_t dim) {
  for (int64_t p = blockIdx.x; p < positions; p += gridDim.x) {
    const T* row = weight + static_cast<int64_t>(indices[p]) * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) out[p * dim + j] = row[j];
  }
}

template <class I>
__global__ void pairs_kernel(int64_t* keys, int64_t* values, const I* indices, int64_t positions) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < positions;
       p += int64_t{gridDim.x} * blockDim.x) {
    keys[p] = static_cast<int64_t>(indices[p]);
    values[p] = p;
  }
}

// A block per run of one index in the sorted keys: the sum of its positions' gradient rows.
template <class T>
__global__ void segment_sum_kernel(T* out, const T* grad, const int64_t* keys, const int64_t* positions_of,
                                   int64_t positions, int64_t dim, int64_t padding_idx) {
  using M = acc_t<T>;
  for (int64_t i = blockIdx.x; i < positions; i += gridDim.x) {
    const int64_t v = keys[i];
    if ((i > 0 && keys[i - 1] == v) || v == padding_idx) continue;  // not a run's first, or padding
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      M acc = 0;
      for (int64_t k = i; k < positions && keys[k] == v; ++k) acc += convert<M>(grad[positions_of[k] * dim + j]);
      out[v * dim + j] = convert<T>(acc);
    }
  }
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

size_t sort_bytes(int64_t positions) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
                                  static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
                                  static_cast<int>(positions));
  return bytes;
}

}  // namespace

void embedding(void* out, const void* weight, const void* indices, DType index_dtype, int64_t positions, int64_t dim,
               DType dtype, int device, cudaStream_t stream) {
  if (positions == 0 || dim == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (dim + 31) / 32 * 32));
  dispatch_all(dtype, "cuda embedding", [&]<class T>(TypeTag<T>) {
    if (index_dtype == kInt32) {
      embedding_kernel<T><<<blocks_for_rows(positions), threads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(weight), static_cast<const int32_t*>(indices), positions, dim);
    } else {
      embedding_kernel<T><<<blocks_for_rows(positions), threads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(weight), static_cast<const int64_t*>(indices), positions, dim);
    }
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

size_t embedding_backward_scratch_bytes(int64_t positions, int device) {
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  return 4 * aligned(static_cast<size_t>(positions) * sizeof(int64_t)) + aligned(sort_bytes(positions));
}

void embedding_backward(void* out, const void* grad, const void* indices, DType index_dtype, int64_t positions,
                        int64_t dim, int64_t num_rows, int64_t padding_idx, void* scratch, size_t scratch_bytes,
                        DType dtype, int device, cudaStream_t stream) {
  if (num_rows == 0 || dim == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  DTR_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(num_rows * dim) * itemsize(dtype), stream), device);
  if (positions == 0) return;
  // Scratch: keys and positions, before and after the sort, then CUB's own.
  const size_t slot = aligned(static_cast<size_t>(positions) * sizeof(int64_t));
  auto* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<int64_t*>(base);
  auto* keys = reinterpret_cast<int64_t*>(base + slot);
  auto* values_in = reinterpret_cast<int64_t*>(base + 2 * slot);
  auto* values = reinterpret_cast<int64_t*>(base + 3 * slot);
  size_t temp_bytes = scratch_bytes - 4 * slot;
  if (index_dtype == kInt32) {
    pairs_kernel<<<blocks_for(positions), kThreads, 0, stream>>>(keys_in, values_in,
                                                                 static_cast<const int32_t*>(indices), positions);
  } else {
    pairs_kernel<<<blocks_for(positions), kThreads, 0, stream>>>(keys_in, values_in,
                                                                 static_cast<const int64_t*>(indices), positions);
  }
  int end_bit = 1;  // the bits num_rows - 1 needs: the sort looks at no more
  while (end_bit < 63 && (int64_t{1} << end_bit) < num_rows) ++end_bit;
  DTR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 4 * slot, temp_bytes, keys_in, keys, values_in, values,
                                                 static_cast<int>(positions), 0, end_bit, stream),
                 device);
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (dim + 31) / 32 * 32));
  dispatch_floating(dtype, "cuda embedding_backward", [&]<class T>(TypeTag<T>) {
    segment_sum_kernel<T><<<blocks_for_rows(positions), threads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(grad), keys, values, positions, dim, padding_idx);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
