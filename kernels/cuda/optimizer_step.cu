#include "kernels/cuda/optimizer_step.h"

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "kernels/cuda/internal/device_math.cuh"

namespace dtr::cuda {
namespace {

using internal::kThreads;
using internal::sqrt_of;

// A launch's tensors and the (tensor, chunk) each block updates: passed by value as the
// kernel's argument (3.2 KB, under the 4 KB every architecture accepts).
struct ListArgs {
  void* param[kMaxListTensors];
  const void* grad[kMaxListTensors];
  void* state[3][kMaxListTensors];
  int64_t n[kMaxListTensors];
  int32_t block_tensor[kMaxListBlocks];
  int32_t block_chunk[kMaxListBlocks];
};

// Calls update(a, tensor, i) for each element i of this block's chunk.
template <class Update>
__global__ void list_kernel(ListArgs a, Update update) {
  const int t = a.block_tensor[blockIdx.x];
  const int64_t begin = int64_t{a.block_chunk[blockIdx.x]} * kListChunk;
  const int64_t end = begin + kListChunk < a.n[t] ? begin + kListChunk : a.n[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) update(a, t, i);
}

template <class T>
struct SgdUpdate {
  using C = acc_t<T>;
  C lr, weight_decay, momentum, keep;
  bool with_momentum, nesterov, first_step;

  __device__ void operator()(const ListArgs& a, int t, int64_t i) const {
    T* p = static_cast<T*>(a.param[t]);
    const C pi = convert<C>(p[i]);
    C gi = convert<C>(static_cast<const T*>(a.grad[t])[i]);
    if (weight_decay != C(0)) gi += weight_decay * pi;
    if (with_momentum) {
      C* buffer = static_cast<C*>(a.state[0][t]);
      const C bi = first_step ? gi : momentum * buffer[i] + keep * gi;
      buffer[i] = bi;
      gi = nesterov ? gi + momentum * bi : bi;
    }
    p[i] = convert<T>(pi - lr * gi);
  }
};

template <class T>
struct AdamUpdate {
  using C = acc_t<T>;
  AdamScalars<C> s;

  __device__ void operator()(const ListArgs& a, int t, int64_t i) const {
    T* p = static_cast<T*>(a.param[t]);
    C* m = static_cast<C*>(a.state[0][t]);
    C* v = static_cast<C*>(a.state[1][t]);
    C* v_max = static_cast<C*>(a.state[2][t]);
    const C pi = convert<C>(p[i]) * s.scale;
    C gi = convert<C>(static_cast<const T*>(a.grad[t])[i]);
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
};

// Packs params into launches of at most kMaxListTensors tensors and kMaxListBlocks chunks;
// a tensor whose chunks do not fit goes on, first in the next launch.
template <class Update>
void launch_lists(std::span<const StepPointers> params, const Update& update, cudaStream_t stream) {
  ListArgs a;
  int tensors = 0, blocks = 0;
  auto put = [&](int slot, const StepPointers& p) {
    a.param[slot] = p.param;
    a.grad[slot] = p.grad;
    for (int k = 0; k < 3; ++k) a.state[k][slot] = p.state[k];
    a.n[slot] = p.n;
  };
  for (const StepPointers& p : params) {
    if (p.n == 0) continue;
    put(tensors++, p);  // p is in slot tensors - 1 until its last chunk is queued
    const int64_t chunks = (p.n + kListChunk - 1) / kListChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      a.block_tensor[blocks] = tensors - 1;
      a.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if (blocks < kMaxListBlocks && !(tensors == kMaxListTensors && last_chunk)) continue;
      list_kernel<<<blocks, kThreads, 0, stream>>>(a, update);
      blocks = 0;
      tensors = 0;
      if (!last_chunk) put(tensors++, p);  // the rest of p's chunks, in slot 0
    }
  }
  if (blocks > 0) list_kernel<<<blocks, kThreads, 0, stream>>>(a, update);
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

void sgd_step(std::span<const StepPointers> params, const SgdScalars& s, DType dtype, int device, cudaStream_t stream) {
  if (params.empty()) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_param(dtype, "cuda sgd_step_", [&]<class T>(TypeTag<T>) {
    using C = acc_t<T>;
    launch_lists(params,
                 SgdUpdate<T>{static_cast<C>(s.lr), static_cast<C>(s.weight_decay), static_cast<C>(s.momentum),
                              static_cast<C>(s.keep), s.momentum != 0.0, s.nesterov, s.first_step},
                 stream);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void adam_step(std::span<const StepPointers> params, const AdamScalars<>& s, DType dtype, int device,
               cudaStream_t stream) {
  if (params.empty()) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_param(dtype, "cuda adam_step_",
                 [&]<class T>(TypeTag<T>) { launch_lists(params, AdamUpdate<T>{s.as<acc_t<T>>()}, stream); });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
