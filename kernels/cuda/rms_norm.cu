#include "kernels/cuda/rms_norm.h"

#include <algorithm>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "kernels/cuda/internal/block_reduce.cuh"
#include "kernels/cuda/internal/device_math.cuh"

namespace dtr::cuda {
namespace {

using internal::block_sum;
using internal::blocks_for_rows;
using internal::kThreads;
using internal::sqrt_of;

template <class T>
__global__ void rms_norm_kernel(T* y, acc_t<T>* rstd, const T* x, const T* weight, int64_t rows, int64_t n,
                                double eps) {
  using M = acc_t<T>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* in = x + row * n;
    M q = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const M v = convert<M>(in[i]);
      q += v * v;
    }
    // 1 / sqrt (both correctly rounded), not rsqrt: the CPU's value, and exact where it can be.
    const M r = M(1) / sqrt_of(block_sum<kThreads>(q) / M(n) + M(eps));
    if (threadIdx.x == 0) rstd[row] = r;
    T* out = y + row * n;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      M v = convert<M>(in[i]) * r;
      if (weight != nullptr) v *= convert<M>(weight[i]);
      out[i] = convert<T>(v);
    }
  }
}

// grad_x = rstd * (g - xhat * mean(g * xhat)) per row, g = grad_y * weight, xhat = x * rstd.
template <class T>
__global__ void rms_norm_grad_x_kernel(T* grad_x, const T* grad_y, const T* x, const acc_t<T>* rstd, const T* weight,
                                       int64_t rows, int64_t n) {
  using M = acc_t<T>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* gy = grad_y + row * n;
    const T* in = x + row * n;
    const M r = rstd[row];
    M sgx = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const M g = convert<M>(gy[i]) * (weight != nullptr ? convert<M>(weight[i]) : M(1));
      sgx += g * convert<M>(in[i]) * r;
    }
    const M mean_gx = block_sum<kThreads>(sgx) / M(n);
    T* out = grad_x + row * n;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const M g = convert<M>(gy[i]) * (weight != nullptr ? convert<M>(weight[i]) : M(1));
      out[i] = convert<T>(r * (g - convert<M>(in[i]) * r * mean_gx));
    }
  }
}

// partials[c][j]: chunk c's sum of grad_y * xhat in column j.
template <class T>
__global__ void rms_norm_partials_kernel(acc_t<T>* partials, const T* grad_y, const T* x, const acc_t<T>* rstd,
                                         int64_t rows, int64_t n, int64_t chunks) {
  using M = acc_t<T>;
  const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x, c = blockIdx.y;
  if (j >= n) return;
  const int64_t per = (rows + chunks - 1) / chunks, first = c * per, last = std::min(rows, first + per);
  M sw = 0;
  for (int64_t row = first; row < last; ++row) {
    sw += convert<M>(grad_y[row * n + j]) * convert<M>(x[row * n + j]) * rstd[row];
  }
  partials[c * n + j] = sw;
}

template <class T>
__global__ void rms_norm_columns_kernel(T* grad_weight, const acc_t<T>* partials, int64_t n, int64_t chunks) {
  using M = acc_t<T>;
  const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (j >= n) return;
  M sw = 0;
  for (int64_t c = 0; c < chunks; ++c) sw += partials[c * n + j];
  grad_weight[j] = convert<T>(sw);
}

}  // namespace

int64_t rms_norm_backward_chunks(int64_t rows) { return std::clamp<int64_t>(rows / 64, 1, 256); }

void rms_norm(void* y, void* rstd, const void* x, const void* weight, int64_t rows, int64_t n, double eps, DType dtype,
              int device, cudaStream_t stream) {
  if (rows == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_floating(dtype, "cuda rms_norm", [&]<class T>(TypeTag<T>) {
    rms_norm_kernel<T><<<blocks_for_rows(rows), kThreads, 0, stream>>>(static_cast<T*>(y), static_cast<acc_t<T>*>(rstd),
                                                                       static_cast<const T*>(x),
                                                                       static_cast<const T*>(weight), rows, n, eps);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void rms_norm_backward(void* grad_x, void* grad_weight, const void* grad_y, const void* x, const void* rstd,
                       const void* weight, void* partials, int64_t rows, int64_t n, DType dtype, int device,
                       cudaStream_t stream) {
  if (n == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  const int64_t chunks = rms_norm_backward_chunks(rows);
  const auto column_blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  dispatch_floating(dtype, "cuda rms_norm_backward", [&]<class T>(TypeTag<T>) {
    using M = acc_t<T>;
    const auto* r = static_cast<const M*>(rstd);
    if (rows > 0) {
      rms_norm_grad_x_kernel<T><<<blocks_for_rows(rows), kThreads, 0, stream>>>(
          static_cast<T*>(grad_x), static_cast<const T*>(grad_y), static_cast<const T*>(x), r,
          static_cast<const T*>(weight), rows, n);
    }
    rms_norm_partials_kernel<T><<<dim3(column_blocks, static_cast<unsigned>(chunks)), kThreads, 0, stream>>>(
        static_cast<M*>(partials), static_cast<const T*>(grad_y), static_cast<const T*>(x), r, rows, n, chunks);
    rms_norm_columns_kernel<T><<<column_blocks, kThreads, 0, stream>>>(static_cast<T*>(grad_weight),
                                                                       static_cast<const M*>(partials), n, chunks);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
