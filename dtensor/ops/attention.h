// Scaled dot-product attention on DTensors, composed of differentiable ops (matmul, a scalar
// multiply of q, causal_mask_fill, softmax), so its sharding and gradient follow their rules.
//
// With q [*, Tq, E], k [*, Tk, E], v [*, Tk, Ev] sharing leading dims * (e.g. [B, H]):
//   q, k, v S(i) on a leading dim  -> out S(i)    batch or head parallel, no communication
//   q S(-2), k and v R             -> out S(-2)   query rows apart; keys whole on every rank
//   k or v sharded on Tk           -> gathered before softmax (it needs whole key rows)
//   q and k sharded on E           -> scores P(sum), reduced before the mask and softmax
// causal_mask_fill masks by global index, so every Shard and R stay and P(op) does for a
// value of 0 (docs/sharding_rules.md, "attention").
#pragma once

#include <cstdint>
#include <optional>

#include "dtensor/dtensor.h"
#include "kernels/causal.h"

namespace dtr {

// x [..., Tq, Tk] with element [..., i, j] set to value where j > i (global indices).
DTensor causal_mask_fill(const DTensor& x, double value);

// How attention is computed (torch's sdpa backends): composed of the ops above (math), or
// the fused kernel of kernels/attention.h (flash) on each rank's local chunks, which never
// holds the [Tq, Tk] scores. kAuto: fused where the placements allow it, composed otherwise.
enum class AttentionBackend : uint8_t { kAuto, kComposed, kFused };

// softmax(q k^T * scale, masked if causal) v -> [*, Tq, Ev]; scale defaults to 1/sqrt(E)
// (PyTorch's scaled_dot_product_attention). The fused backend takes placements under which
// each rank's chunks are whole problems: on every mesh dim q, k and v Replicate or Shard
// the same leading dim, or q Shard(-2) with k and v Replicate (k's and v's gradients are
// then Partial(sum) there); out is placed like q, and no collective runs forward or
// backward. kFused with other placements is a ValueError naming them.
// q, k, v share a floating dtype and their leading dims; ValueError naming all three otherwise.
DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v, Causal causal = Causal::kNo,
                                     std::optional<double> scale = std::nullopt,
                                     AttentionBackend backend = AttentionBackend::kAuto);

// Whether the fused backend takes q, k and v as placed (one mesh; the rule above).
bool fused_attention_fits(const DTensor& q, const DTensor& k, const DTensor& v);

}  // namespace dtr
