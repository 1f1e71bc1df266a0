#include "kernels/cuda/softmax.h"

#include <algorithm>
#include <limits>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "kernels/cuda/internal/block_reduce.cuh"
#include "kernels/cuda/internal/device_math.cuh"

namespace dtr::cuda {
namespace {

using internal::block_reduce;
using internal::block_sum;
using internal::blocks_for_rows;
using internal::exp_of;
using internal::kThreads;
using internal::log_of;

// A running (max, sum of exp(v - max)) over some values.
template <class M>
struct MaxSum {
  M max, sum;
};

template <class M>
__device__ inline MaxSum<M> fold(MaxSum<M> a, MaxSum<M> b) {
  const M m = a.max > b.max ? a.max : b.max;
  if (m == -std::numeric_limits<M>::infinity()) return {m, M(0)};  // nothing seen on either side
  return {m, a.sum * exp_of(a.max - m) + b.sum * exp_of(b.max - m)};
}

template <class T>
__global__ void softmax_kernel(T* y, const T* x, int64_t rows, int64_t cols, SoftmaxKind kind) {
  using M = opmath_t<T>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* in = x + row * cols;
    MaxSum<M> acc{-std::numeric_limits<M>::infinity(), M(0)};
    for (int64_t i = threadIdx.x; i < cols; i += kThreads) acc = fold(acc, MaxSum<M>{convert<M>(in[i]), M(1)});
    // block_reduce shuffles scalars: fold the pair as two reductions sharing the max.
    const M max =
        block_reduce<kThreads>(acc.max, -std::numeric_limits<M>::infinity(), [](M a, M b) { return a > b ? a : b; });
    const M mine = acc.max == -std::numeric_limits<M>::infinity() ? M(0) : acc.sum * exp_of(acc.max - max);
    const M sum = block_sum<kThreads>(mine);
    T* out = y + row * cols;
    if (kind == SoftmaxKind::kSoftmax) {
      const M inverse = M(1) / sum;
      for (int64_t i = threadIdx.x; i < cols; i += kThreads)
        out[i] = convert<T>(exp_of(convert<M>(in[i]) - max) * inverse);
    } else {
      const M shift = max + log_of(sum);
      for (int64_t i = threadIdx.x; i < cols; i += kThreads) out[i] = convert<T>(convert<M>(in[i]) - shift);
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(T* grad_x, const T* grad_y, const T* y, int64_t rows, int64_t cols,
                                        SoftmaxKind kind) {
  using M = opmath_t<T>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* gy = grad_y + row * cols;
    const T* yy = y + row * cols;
    M partial = 0;
    for (int64_t i = threadIdx.x; i < cols; i += kThreads) {
      partial += kind == SoftmaxKind::kSoftmax ? convert<M>(gy[i]) * convert<M>(yy[i]) : convert<M>(gy[i]);
    }
    const M dot = block_sum<kThreads>(partial);
    T* gx = grad_x + row * cols;
    for (int64_t i = threadIdx.x; i < cols; i += kThreads) {
      const M g = convert<M>(gy[i]), v = convert<M>(yy[i]);
      gx[i] = convert<T>(kind == SoftmaxKind::kSoftmax ? v * (g - dot) : g - exp_of(v) * dot);
    }
  }
}

}  // namespace

void softmax(void* y, const void* x, int64_t rows, int64_t cols, DType dtype, SoftmaxKind kind, int device,
             cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_floating(dtype, "cuda softmax", [&]<class T>(TypeTag<T>) {
    softmax_kernel<T><<<blocks_for_rows(rows), kThreads, 0, stream>>>(static_cast<T*>(y), static_cast<const T*>(x),
                                                                      rows, cols, kind);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void softmax_backward(void* grad_x, const void* grad_y, const void* y, int64_t rows, int64_t cols, DType dtype,
                      SoftmaxKind kind, int device, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_floating(dtype, "cuda softmax_backward", [&]<class T>(TypeTag<T>) {
    softmax_backward_kernel<T><<<blocks_for_rows(rows), kThreads, 0, stream>>>(
        static_cast<T*>(grad_x), static_cast<const T*>(grad_y), static_cast<const T*>(y), rows, cols, kind);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
