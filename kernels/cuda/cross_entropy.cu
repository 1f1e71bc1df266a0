#include "kernels/cuda/cross_entropy.h"

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

// Per row: lse and the row's loss (into scratch[row]).
template <class T>
__global__ void rows_kernel(acc_t<T>* lse, double* row_loss, int32_t* bad_target, const T* logits,
                            const int64_t* target, int64_t n, int64_t c, int64_t ignore_index, double label_smoothing) {
  using M = acc_t<T>;
  constexpr M kNegInf = -std::numeric_limits<M>::infinity();
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const T* in = logits + row * c;
    M max = kNegInf, sum = 0, logits_sum = 0;
    for (int64_t k = threadIdx.x; k < c; k += kThreads) {
      const M v = convert<M>(in[k]);
      logits_sum += v;
      if (v > max) {
        sum = (max == kNegInf ? M(0) : sum * exp_of(max - v)) + M(1);
        max = v;
      } else {
        sum += exp_of(v - max);
      }
    }
    const M row_max = block_reduce<kThreads>(max, kNegInf, [](M a, M b) { return a > b ? a : b; });
    const M row_sum = block_sum<kThreads>(max == kNegInf ? M(0) : sum * exp_of(max - row_max));
    // The same on every thread of the block, so all of them take part in the sum or none.
    const M row_logits_sum = label_smoothing != 0.0 ? block_sum<kThreads>(logits_sum) : M(0);
    if (threadIdx.x == 0) {
      const M l = row_max + log_of(row_sum);
      lse[row] = l;
      const int64_t t = target[row];
      double contribution = 0;
      if (t != ignore_index) {
        if (t < 0 || t >= c) {
          atomicOr(bad_target, 1);
        } else {
          const double e = label_smoothing, x_t = static_cast<double>(convert<M>(in[t]));
          contribution = e == 0.0 ? static_cast<double>(l) - x_t
                                  : static_cast<double>(l) - (1.0 - e) * x_t -
                                        e * static_cast<double>(row_logits_sum) / static_cast<double>(c);
        }
      }
      row_loss[row] = contribution;
    }
  }
}

// One block: the loss from the rows' contributions, and (for kMean) 1 / rows counted.
template <class T>
__global__ void total_kernel(T* loss, const double* row_loss, const int64_t* target, int64_t n, int64_t ignore_index,
                             bool mean) {
  double s = 0, count = 0;
  for (int64_t row = threadIdx.x; row < n; row += kThreads) {
    s += row_loss[row];
    count += target[row] != ignore_index ? 1.0 : 0.0;
  }
  s = block_sum<kThreads>(s);
  count = block_sum<kThreads>(count);
  if (threadIdx.x == 0) *loss = convert<T>(mean ? s / count : s);  // 0 / 0: NaN, as torch
}

__global__ void scale_kernel(double* scale, const int64_t* target, int64_t n, int64_t ignore_index, bool mean) {
  double count = 0;
  for (int64_t row = threadIdx.x; row < n; row += kThreads) count += target[row] != ignore_index ? 1.0 : 0.0;
  count = block_sum<kThreads>(count);
  if (threadIdx.x == 0) *scale = mean ? 1.0 / count : 1.0;
}

template <class T>
__global__ void grad_kernel(T* grad, const T* logits, const int64_t* target, const acc_t<T>* lse,
                            const double* grad_loss, const double* scale, int64_t n, int64_t c, int64_t ignore_index,
                            double label_smoothing) {
  using M = acc_t<T>;
  // The smoothed target: (1 - e) on the target class plus e / c on every class.
  const M on_target = static_cast<M>(1.0 - label_smoothing);
  const M uniform = static_cast<M>(label_smoothing / static_cast<double>(c));
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const int64_t t = target[row];
    T* out = grad + row * c;
    if (t == ignore_index) {
      for (int64_t k = threadIdx.x; k < c; k += kThreads) out[k] = T(0.0f);
      continue;
    }
    const M g = static_cast<M>(*grad_loss * *scale), l = lse[row];
    const T* in = logits + row * c;
    for (int64_t k = threadIdx.x; k < c; k += kThreads) {
      out[k] = convert<T>((exp_of(convert<M>(in[k]) - l) - uniform - (k == t ? on_target : M(0))) * g);
    }
  }
}

}  // namespace

void cross_entropy(void* loss, void* logsumexp, int32_t* bad_target, const void* logits, const int64_t* target,
                   int64_t n, int64_t c, int64_t ignore_index, bool mean, double label_smoothing, double* scratch,
                   DType dtype, int device, cudaStream_t stream) {
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_floating(dtype, "cuda cross_entropy", [&]<class T>(TypeTag<T>) {
    if (n > 0) {
      rows_kernel<T><<<blocks_for_rows(n), kThreads, 0, stream>>>(static_cast<acc_t<T>*>(logsumexp), scratch,
                                                                  bad_target, static_cast<const T*>(logits), target, n,
                                                                  c, ignore_index, label_smoothing);
    }
    total_kernel<T><<<1, kThreads, 0, stream>>>(static_cast<T*>(loss), scratch, target, n, ignore_index, mean);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void cross_entropy_backward(void* grad, const void* logits, const int64_t* target, const void* logsumexp,
                            const double* grad_loss, int64_t n, int64_t c, int64_t ignore_index, bool mean,
                            double label_smoothing, double* scratch, DType dtype, int device, cudaStream_t stream) {
  if (n == 0 || c == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  scale_kernel<<<1, kThreads, 0, stream>>>(scratch, target, n, ignore_index, mean);
  dispatch_floating(dtype, "cuda cross_entropy_backward", [&]<class T>(TypeTag<T>) {
    grad_kernel<T><<<blocks_for_rows(n), kThreads, 0, stream>>>(
        static_cast<T*>(grad), static_cast<const T*>(logits), target, static_cast<const acc_t<T>*>(logsumexp),
        grad_loss, scratch, n, c, ignore_index, label_smoothing);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
