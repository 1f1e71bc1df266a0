// CUDA fused attention and its backward: the CUDA half of kernels/attention.h.
//
// q [batch, tq, e], k [batch, tk, e], v [batch, tk, ev], grad_out and out [batch, tq, ev]
// contiguous, of `dtype`; lse and the scratch in the statistics type (float, double for
// float64). e, ev in [1, kAttentionMaxHeadDim], tk >= 1, query_offset >= 0.
// kFused forward: a block per (batch, 64 or 32 query rows) walks the visible key tiles of 64
// (causal: tiles above the diagonal skipped), K and V staged in shared memory, an online
// softmax per row with float accumulators; bfloat16/float16 multiply on tensor cores (wmma,
// m16n16k16, the probabilities rounded to the input type for P v), float32/float64 on the
// SIMT cores (32 or 16 rows a tile) in their own precision. kFused backward
// (FlashAttention-2): D = rowsum(grad_out * out) into scratch, then a block per key tile
// loops over query tiles for grad_k and grad_v, and a block per query tile over key tiles
// for grad_q; each output element is summed by one thread in a fixed order (no atomics), so
// the bits never depend on scheduling. kReference: a block per query row (forward, grad_q)
// or key row (grad_k, grad_v) with its row of scores in global scratch. Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/attention_impl.h"
#include "kernels/causal.h"

namespace dtr::cuda {

inline constexpr int64_t kAttentionMaxHeadDim = 256;

// One call's sizes and options.
struct AttentionProblem {
  int64_t batch = 0, tq = 0, tk = 0, e = 0, ev = 0;
  int64_t query_offset = 0;     // query row i is global row query_offset + i
  Causal causal = Causal::kNo;  // kYes: row i sees keys j <= query_offset + i
  double scale = 1.0;
};

// Statistics-type elements of scratch each launcher needs (0: pass nullptr).
int64_t attention_scratch_numel(const AttentionProblem& problem, AttentionImpl impl);
int64_t attention_backward_scratch_numel(const AttentionProblem& problem, AttentionImpl impl);

void attention(void* out, void* lse, const void* q, const void* k, const void* v, void* scratch,
               const AttentionProblem& problem, AttentionImpl impl, DType dtype, int device, cudaStream_t stream);
void attention_backward(void* grad_q, void* grad_k, void* grad_v, const void* grad_out, const void* q, const void* k,
                        const void* v, const void* out, const void* lse, void* scratch, const AttentionProblem& problem,
                        AttentionImpl impl, DType dtype, int device, cudaStream_t stream);

}  // namespace dtr::cuda
