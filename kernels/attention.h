// Fused scaled-dot-product attention, forward and backward, without the [Tq, Tk] score matrix.
//
// out = softmax(q k^T * scale, masked) v, per batch entry: q [*, Tq, E], k [*, Tk, E],
// v [*, Tk, Ev] with the same leading dims * (any number, none included). Causal::kYes: query row
// i, whose global index is query_offset + i (a rank's shard of query rows starts at its
// offset), sees key j iff j <= query_offset + i (dtensor's causal_mask_fill). lse [*, Tq] is
// the logsumexp of each scaled, masked score row, saved for the backward, which recomputes
// the probabilities P = exp(q k^T * scale - lse) tile by tile (FlashAttention-2):
//   D = rowsum(grad_out * out)          [*, Tq]
//   dS = P * (grad_out v^T - D)         [*, Tq, Tk], never stored whole
//   grad_q = dS k * scale, grad_k = dS^T q * scale, grad_v = P^T grad_out.
// Every output is new (nothing accumulates into a caller's tensor). Extra memory is O(T), not
// O(T^2). Results are bitwise reproducible on any thread count (CPU) and run to run (CUDA: no
// atomics). Edge cases: Tq == 0 or an empty batch gives empty out and lse, and a backward of
// empty grad_q with zero grad_k and grad_v; Tk == 0, E == 0, Ev == 0 and query_offset < 0 are
// ValueErrors (so every causal row sees key 0, and no row is empty). (torch's
// scaled_dot_product_attention, with its flash backend's lse.)
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/attention_impl.h"
#include "kernels/causal.h"

namespace dtr {

struct AttentionOutput {
  Tensor out;  // [*, Tq, Ev], q's dtype
  Tensor lse;  // [*, Tq], float32 (float64 for float64 inputs)
};

struct AttentionGrads {
  Tensor grad_q, grad_k, grad_v;  // q's, k's and v's shapes, q's dtype, contiguous
};

// q, k, v: one floating dtype (float32, float64, bfloat16, float16), one device, any strides;
// scale finite. CUDA takes E, Ev <= 256 (NotImplementedError beyond).
AttentionOutput attention(const Tensor& q, const Tensor& k, const Tensor& v, Causal causal, double scale,
                          int64_t query_offset = 0, AttentionImpl impl = AttentionImpl::kFused);

// grad_out and out [*, Tq, Ev] of q's dtype; lse the forward's; the forward's other arguments.
AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, Causal causal, double scale,
                                  int64_t query_offset = 0, AttentionImpl impl = AttentionImpl::kFused);

}  // namespace dtr
