#include "kernels/cuda/layer_norm.h"

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
using internal::rsqrt_of;

template <class T>
__global__ void layer_norm_kernel(T* y, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const T* weight, const T* bias,
                                  int64_t rows, int64_t n, double eps) {
  using M = acc_t<T>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* in = x + row * n;
    M s = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) s += convert<M>(in[i]);
    const M mu = block_sum<kThreads>(s) / M(n);
    M q = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const M d = convert<M>(in[i]) - mu;
      q += d * d;
    }
    const M r = rsqrt_of(block_sum<kThreads>(q) / M(n) + M(eps));
    if (threadIdx.x == 0) {
      mean[row] = mu;
      rstd[row] = r;
    }
    T* out = y + row * n;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      M v = (convert<M>(in[i]) - mu) * r;
      if (weight != nullptr) v *= convert<M>(weight[i]);
      if (bias != nullptr) v += convert<M>(bias[i]);
      out[i] = convert<T>(v);
    }
  }
}

template <class T>
__global__ void layer_norm_grad_x_kernel(T* grad_x, const T* grad_y, const T* x, const acc_t<T>* mean,
                                         const acc_t<T>* rstd, const T* weight, int64_t rows, int64_t n) {
  using M = acc_t<T>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* gy = grad_y + row * n;
    const T* in = x + row * n;
    const M mu = mean[row], r = rstd[row];
    M sg = 0, sgx = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const M g = convert<M>(gy[i]) * (weight != nullptr ? convert<M>(weight[i]) : M(1));
      sg += g;
      sgx += g * (convert<M>(in[i]) - mu) * r;
    }
    const M mean_g = block_sum<kThreads>(sg) / M(n), mean_gx = block_sum<kThreads>(sgx) / M(n);
    T* out = grad_x + row * n;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const M g = convert<M>(gy[i]) * (weight != nullptr ? convert<M>(weight[i]) : M(1));
      const M xhat = (convert<M>(in[i]) - mu) * r;
      out[i] = convert<T>(r * (g - mean_g - xhat * mean_gx));
    }
  }
}

// partials[c][j] and partials[chunks + c][j]: chunk c's sums of grad_y * xhat and grad_y.
template <class T>
__global__ void layer_norm_partials_kernel(acc_t<T>* partials, const T* grad_y, const T* x, const acc_t<T>* mean,
                                           const acc_t<T>* rstd, int64_t rows, int64_t n, int64_t chunks) {
  using M = acc_t<T>;
  const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x, c = blockIdx.y;
  if (j >= n) return;
  const int64_t per = (rows + chunks - 1) / chunks, first = c * per, last = std::min(rows, first + per);
  M sw = 0, sb = 0;
  for (int64_t row = first; row < last; ++row) {
    const M g = convert<M>(grad_y[row * n + j]);
    sw += g * (convert<M>(x[row * n + j]) - mean[row]) * rstd[row];
    sb += g;
  }
  partials[c * n + j] = sw;
  partials[(chunks + c) * n + j] = sb;
}

template <class T>
__global__ void layer_norm_columns_kernel(T* grad_weight, T* grad_bias, const acc_t<T>* partials, int64_t n,
                                          int64_t chunks) {
  using M = acc_t<T>;
  const int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (j >= n) return;
  M sw = 0, sb = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    sw += partials[c * n + j];
    sb += partials[(chunks + c) * n + j];
  }
  grad_weight[j] = convert<T>(sw);
  grad_bias[j] = convert<T>(sb);
}

}  // namespace

int64_t layer_norm_backward_chunks(int64_t rows) { return std::clamp<int64_t>(rows / 64, 1, 256); }

void layer_norm(void* y, void* mean, void* rstd, const void* x, const void* weight, const void* bias, int64_t rows,
                int64_t n, double eps, DType dtype, int device, cudaStream_t stream) {
  if (rows == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_floating(dtype, "cuda layer_norm", [&]<class T>(TypeTag<T>) {
    layer_norm_kernel<T><<<blocks_for_rows(rows), kThreads, 0, stream>>>(
        static_cast<T*>(y), static_cast<acc_t<T>*>(mean), static_cast<acc_t<T>*>(rstd), static_cast<const T*>(x),
        static_cast<const T*>(weight), static_cast<const T*>(bias), rows, n, eps);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void layer_norm_backward(void* grad_x, void* grad_weight, void* grad_bias, const void* grad_y, const void* x,
                         const void* mean, const void* rstd, const void* weight, void* partials, int64_t rows,
                         int64_t n, DType dtype, int device, cudaStream_t stream) {
  if (n == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  const int64_t chunks = layer_norm_backward_chunks(rows);
  const auto column_blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  dispatch_floating(dtype, "cuda layer_norm_backward", [&]<class T>(TypeTag<T>) {
    using M = acc_t<T>;
    const auto* m = static_cast<const M*>(mean);
    const auto* r = static_cast<const M*>(rstd);
    if (rows > 0) {
      layer_norm_grad_x_kernel<T><<<blocks_for_rows(rows), kThreads, 0, stream>>>(
          static_cast<T*>(grad_x), static_cast<const T*>(grad_y), static_cast<const T*>(x), m, r,
          static_cast<const T*>(weight), rows, n);
    }
    layer_norm_partials_kernel<T><<<dim3(column_blocks, static_cast<unsigned>(chunks)), kThreads, 0, stream>>>(
        static_cast<M*>(partials), static_cast<const T*>(grad_y), static_cast<const T*>(x), m, r, rows, n, chunks);
    layer_norm_columns_kernel<T><<<column_blocks, kThreads, 0, stream>>>(
        static_cast<T*>(grad_weight), static_cast<T*>(grad_bias), static_cast<const M*>(partials), n, chunks);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
