// What the three families of CUDA attention kernels share (attention_simt.cu,
// attention_wmma.cu, attention_reference.cu): the statistics type, the causal rule on host
// and device, warp folds, launch helpers, and each family's entry point, which
// kernels/cuda/attention.cu picks by implementation and dtype.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/dtype.h"
#include "kernels/cuda/attention.h"

namespace dtr::cuda::internal {

template <class T>
using stat_t = opmath_t<T>;  // float for bfloat16, float16 and float32; double for float64

constexpr unsigned kFullMask = 0xffffffffu;

// --- the problem's shape and causal rule, on host and device ---

// Query row i sees keys [0, key_end(p, i)).
__host__ __device__ inline int64_t key_end(const AttentionProblem& p, int64_t i) {
  if (p.causal == Causal::kNo) return p.tk;
  const int64_t end = p.query_offset + i + 1;
  return end < p.tk ? end : p.tk;
}

// Key j is seen by query rows [query_begin(p, j), tq).
__host__ __device__ inline int64_t query_begin(const AttentionProblem& p, int64_t j) {
  if (p.causal == Causal::kNo) return 0;
  const int64_t begin = j - p.query_offset;
  return begin < 0 ? 0 : begin < p.tq ? begin : p.tq;
}

template <class M>
__host__ __device__ inline M minus_infinity() {
  return -std::numeric_limits<M>::infinity();
}

template <class M>
__device__ inline M max_of(M a, M b) {
  return a > b ? a : b;
}

// Folds v over the kWidth consecutive lanes of its group (kWidth divides 32); every lane of
// the warp must call it, and each gets its group's result.
template <int kWidth, class M>
__device__ inline M group_max(M v) {
  for (int offset = kWidth / 2; offset > 0; offset /= 2) v = max_of(v, __shfl_xor_sync(kFullMask, v, offset, kWidth));
  return v;
}

template <int kWidth, class M>
__device__ inline M group_sum(M v) {
  for (int offset = kWidth / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset, kWidth);
  return v;
}

// The blocks a work list of `items` tiles or rows is launched on (blocks loop past the cap).
inline int grid_for(int64_t items) { return static_cast<int>(std::clamp<int64_t>(items, 1, kMaxBlocks)); }

// Asks for more than the default 48 KiB of dynamic shared memory where a kernel needs it.
template <class Kernel>
inline void allow_shared_memory(Kernel kernel, size_t bytes, int device) {
  DTR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                 device);
}

// The head-dim bound a kernel is compiled for: 64, 128 or 256 >= max(e, ev).
template <class F>
inline void dispatch_head_dim(int64_t e, int64_t ev, F&& f) {
  const int64_t d = std::max(e, ev);
  if (d <= 64) {
    f(std::integral_constant<int, 64>{});
  } else if (d <= 128) {
    f(std::integral_constant<int, 128>{});
  } else {
    f(std::integral_constant<int, 256>{});
  }
}

// ---- Each family's entry point: pointers of `dtype` (and its stat_t), as attention.h's ----

// SIMT (attention_simt.cu): the fused forward of float32 and float64.
void simt_attention_forward(void* out, void* lse, const void* q, const void* k, const void* v,
                            const AttentionProblem& p, DType dtype, int device, cudaStream_t stream);
// SIMT: the fused backward of every dtype; `delta` holds batch * tq statistics.
void simt_attention_backward(void* grad_q, void* grad_k, void* grad_v, const void* grad_out, const void* q,
                             const void* k, const void* v, const void* out, const void* lse, void* delta,
                             const AttentionProblem& p, DType dtype, int device, cudaStream_t stream);
// Tensor cores (attention_wmma.cu): the fused forward of bfloat16 and float16.
void wmma_attention_forward(void* out, void* lse, const void* q, const void* k, const void* v,
                            const AttentionProblem& p, DType dtype, int device, cudaStream_t stream);
// Reference (attention_reference.cu): every dtype, with the scratch its *_numel names.
int64_t reference_attention_scratch_numel(const AttentionProblem& p);
int64_t reference_attention_backward_scratch_numel(const AttentionProblem& p);
void reference_attention_forward(void* out, void* lse, const void* q, const void* k, const void* v, void* scratch,
                                 const AttentionProblem& p, DType dtype, cudaStream_t stream);
void reference_attention_backward(void* grad_q, void* grad_k, void* grad_v, const void* grad_out, const void* q,
                                  const void* k, const void* v, const void* out, const void* lse, void* scratch,
                                  const AttentionProblem& p, DType dtype, cudaStream_t stream);

}  // namespace dtr::cuda::internal
