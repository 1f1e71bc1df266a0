#include "kernels/cuda/index.h"

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/cuda/map_index.cuh"

namespace dtr::cuda {
namespace {

using internal::blocks_for;
using internal::kThreads;

template <class I>
__global__ void check_index_kernel(int32_t* bad, MapOperand index, MapShape shape, int64_t size) {
  const MapOperand* const operands[] = {&index};
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < shape.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[1];
    internal::map_offsets(shape, operands, i, off);
    const int64_t v = static_cast<const I*>(index.data)[off[0]];
    if (v < 0 || v >= size) *bad = 1;  // every writer stores the same value
  }
}

// A thread per element of index: out[e, k] = x[e, index[e, k]].
template <class T, class I>
__global__ void gather_kernel(MapOperand out, MapOperand x, MapOperand index, MapShape shape, int dim,
                              const int32_t* bad) {
  if (*bad != 0) return;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < shape.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, o = 0, xo = 0, io = 0;
    for (int d = shape.ndim - 1; d >= 0; --d) {
      const int64_t c = rest % shape.sizes[d];
      rest /= shape.sizes[d];
      o += c * out.strides[d];
      io += c * index.strides[d];
      if (d != dim) xo += c * x.strides[d];
    }
    const int64_t j = static_cast<const I*>(index.data)[io];
    static_cast<T*>(out.data)[o] = static_cast<const T*>(x.data)[xo + j * x.strides[dim]];
  }
}

// A thread per slice position e (every dim but dim, the innermost fastest), walking k in
// order: x[e, index[e, k]] += src[e, k]. Slice positions name disjoint columns of x.
template <class T, class I>
__global__ void scatter_add_kernel(MapOperand x, MapOperand index, MapOperand src, MapShape shape, int dim,
                                   const int32_t* bad) {
  if (*bad != 0) return;
  using M = acc_t<T>;
  const int64_t k_count = shape.sizes[dim];
  const int64_t positions = shape.numel / k_count;
  T* const xp = static_cast<T*>(x.data);
  const T* const sp = static_cast<const T*>(src.data);
  const I* const ip = static_cast<const I*>(index.data);
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < positions;
       p += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = p, xo = 0, io = 0, so = 0;
    for (int d = shape.ndim - 1; d >= 0; --d) {
      if (d == dim) continue;
      const int64_t c = rest % shape.sizes[d];
      rest /= shape.sizes[d];
      xo += c * x.strides[d];
      io += c * index.strides[d];
      so += c * src.strides[d];
    }
    for (int64_t k = 0; k < k_count; ++k) {
      const int64_t j = ip[io + k * index.strides[dim]];
      T& v = xp[xo + j * x.strides[dim]];
      v = convert<T>(convert<M>(v) + convert<M>(sp[so + k * src.strides[dim]]));
    }
  }
}

// Calls f(TypeTag<I>{}) for the index dtype, int32 or int64 (the op has checked it).
template <class F>
void dispatch_index(DType index_dtype, F&& f) {
  if (index_dtype == kInt32) {
    f(TypeTag<int32_t>{});
  } else {
    f(TypeTag<int64_t>{});
  }
}

}  // namespace

void check_index(int32_t* bad, const MapOperand& index, DType index_dtype, const MapShape& shape, int64_t size,
                 int device, cudaStream_t stream) {
  if (shape.numel == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_index(index_dtype, [&]<class I>(TypeTag<I>) {
    check_index_kernel<I><<<blocks_for(shape.numel), kThreads, 0, stream>>>(bad, index, shape, size);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void gather(const MapOperand& out, const MapOperand& x, const MapOperand& index, DType index_dtype,
            const MapShape& shape, int dim, const int32_t* bad, DType dtype, int device, cudaStream_t stream) {
  if (shape.numel == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_all(dtype, "cuda gather", [&]<class T>(TypeTag<T>) {
    dispatch_index(index_dtype, [&]<class I>(TypeTag<I>) {
      gather_kernel<T, I><<<blocks_for(shape.numel), kThreads, 0, stream>>>(out, x, index, shape, dim, bad);
    });
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void scatter_add(const MapOperand& x, const MapOperand& index, DType index_dtype, const MapOperand& src,
                 const MapShape& shape, int dim, const int32_t* bad, DType dtype, int device, cudaStream_t stream) {
  if (shape.numel == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  const int64_t positions = shape.numel / shape.sizes[dim];
  dispatch_numeric(dtype, "cuda scatter_add_", [&]<class T>(TypeTag<T>) {
    dispatch_index(index_dtype, [&]<class I>(TypeTag<I>) {
      scatter_add_kernel<T, I><<<blocks_for(positions), kThreads, 0, stream>>>(x, index, src, shape, dim, bad);
    });
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
