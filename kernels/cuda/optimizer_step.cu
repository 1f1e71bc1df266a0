#include "kernels/cuda/optimizer_step.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/internal/device_math.cuh"
#include "kernels/cuda/internal/launch.h"

namespace dtr::cuda {
namespace {

using internal::blocks_for;
using internal::kThreads;
using internal::sqrt_of;

template <class T>
__global__ void sgd_kernel(T* p, acc_t<T>* buffer, const T* g, int64_t n, acc_t<T> lr, acc_t<T> weight_decay,
                           acc_t<T> momentum, acc_t<T> keep, bool nesterov, bool first_step) {
  using C = acc_t<T>;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const C pi = convert<C>(p[i]);
    C gi = convert<C>(g[i]);
    if (weight_decay != C(0)) gi += weight_decay * pi;
    if (buffer != nullptr) {
      const C bi = first_step ? gi : momentum * buffer[i] + keep * gi;
      buffer[i] = bi;
      gi = nesterov ? gi + momentum * bi : bi;
    }
    p[i] = convert<T>(pi - lr * gi);
  }
}

template <class T>
__global__ void adam_kernel(T* p, acc_t<T>* m, acc_t<T>* v, acc_t<T>* v_max, const T* g, int64_t n,
                            AdamScalars<acc_t<T>> s) {
  using C = acc_t<T>;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const C pi = convert<C>(p[i]) * s.scale;
    C gi = convert<C>(g[i]);
    if (s.l2 != C(0)) gi += s.l2 * pi;
    const C mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
    const C vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    C denominator = vi;
    if (v_max != nullptr) {
      denominator = v_max[i] > vi ? v_max[i] : vi;
      v_max[i] = denominator;
    }
    p[i] = convert<T>(pi - s.step_size * mi / (sqrt_of(denominator) / s.bias_correction2_sqrt + s.eps));
  }
}

// The parameter dtypes the optimizers take (kernels/optimizer_step.h).
template <class F>
void dispatch_param(DType d, const char* op, F&& f) {
  switch (d) {
    case kFloat32: return f(TypeTag<float>{});
    case kFloat64: return f(TypeTag<double>{});
    case kBFloat16: return f(TypeTag<BFloat16>{});
    default: throw_dtype_not_implemented(op, d);
  }
}

}  // namespace

void sgd_step(void* param, void* momentum_buffer, const void* grad, int64_t n, const SgdScalars& s, DType dtype,
              int device, cudaStream_t stream) {
  if (n == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_param(dtype, "cuda sgd_step_", [&]<class T>(TypeTag<T>) {
    using C = acc_t<T>;
    sgd_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<T*>(param), static_cast<C*>(momentum_buffer), static_cast<const T*>(grad), n, static_cast<C>(s.lr),
        static_cast<C>(s.weight_decay), static_cast<C>(s.momentum), static_cast<C>(s.keep), s.nesterov, s.first_step);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void adam_step(void* param, void* exp_avg, void* exp_avg_sq, void* max_exp_avg_sq, const void* grad, int64_t n,
               const AdamScalars<>& s, DType dtype, int device, cudaStream_t stream) {
  if (n == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_param(dtype, "cuda adam_step_", [&]<class T>(TypeTag<T>) {
    using C = acc_t<T>;
    adam_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(param), static_cast<C*>(exp_avg),
                                                           static_cast<C*>(exp_avg_sq), static_cast<C*>(max_exp_avg_sq),
                                                           static_cast<const T*>(grad), n, s.as<C>());
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
