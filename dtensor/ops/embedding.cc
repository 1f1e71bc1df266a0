#include "dtensor/ops/embedding.h"

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fill.h"
#include "kernels/reduce.h"

namespace dtr {
namespace {

// The lookup by a rank whose weight holds global rows [row0, row0 + weight.size(0)) of V:
// those rows for indices in range, zero rows for the others.
Tensor masked_lookup(const Tensor& weight, const Tensor& indices, int64_t row0, int64_t num_rows,
                     const DTensor& full_weight, const DTensor& full_indices) {
  if (indices.numel() > 0) {
    const int64_t lo = static_cast<int64_t>(min(indices).item()), hi = static_cast<int64_t>(max(indices).item());
    DTR_CHECK(lo >= 0 && hi < num_rows, IndexError,
              "embedding: indices {} hold values in [{}, {}]; weight {} has rows [0, {})", describe(full_indices), lo,
              hi, describe(full_weight), num_rows);
  }
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.size(1));
  const int64_t local_rows = weight.size(0);
  if (local_rows == 0) return zeros(out_shape, weight.dtype(), weight.device());
  // Indices clamped into the local rows; a position is ours where clamping left it alone.
  const Tensor shifted = sub(indices, static_cast<double>(row0));
  const Tensor clamped = clamp(shifted, 0.0, static_cast<double>(local_rows - 1));
  return masked_fill(embedding(weight, clamped), ne(shifted, clamped).unsqueeze(-1), 0.0);
}

// grad_weight [V, D] from grad [*, D] (rules: docs/sharding_rules.md); under --deterministic
// one scatter per sequence into its own [V, D], summed in kernels/block_reduce.h's tree. Not
// differentiable.
DTensor embedding_backward(const DTensor& grad, const DTensor& indices, int64_t num_weights) {
  const int64_t nd = indices.dim();
  std::vector<DimStrategy> per_dim;
  for (int64_t k = 0; k < nd; ++k) per_dim.push_back({{Shard(k), Shard(k)}, {Partial()}});
  per_dim.push_back({{Shard(nd), Replicate()}, {Shard(1)}});
  per_dim.push_back(replicate_all(2));
  add_linear_partials(per_dim, 2, 0);
  const DTensor inputs[] = {grad, indices};
  AppliedStrategy s = apply_strategy("embedding backward", inputs, expand_strategies(per_dim, grad.mesh().ndim()));
  const Tensor& g = s.inputs[0].to_local();
  const Tensor& idx = s.inputs[1].to_local();
  const int64_t block = block_rows(g.shape(), nd, "embedding backward");
  Tensor local;
  if (block == 0) {
    local = embedding_backward(g, idx, num_weights);
  } else {
    const Tensor g_rows = g.flatten(0, nd - 1), idx_rows = idx.flatten();
    local = reduce_rows(idx.numel(), block, [&](int64_t first, int64_t n) {
      return std::vector{embedding_backward(g_rows.narrow(0, first, n), idx_rows.narrow(0, first, n), num_weights)};
    })[0];
  }
  return make_output(std::move(local), grad.mesh(), s.strategy.outputs[0], {num_weights, grad.size(-1)});
}

}  // namespace

DTensor embedding(const DTensor& weight, const DTensor& indices) {
  DTR_CHECK(weight.dim() == 2 && is_floating(weight.dtype()), ValueError,
            "embedding: weight {} must be a floating [num_embeddings, embedding_dim] table", describe(weight));
  DTR_CHECK(indices.dtype() == kInt32 || indices.dtype() == kInt64, TypeError,
            "embedding: indices {} must be int32 or int64", describe(indices));
  const int64_t nd = indices.dim();
  std::vector<DimStrategy> per_dim;
  for (int64_t k = 0; k < nd; ++k) per_dim.push_back({{Replicate(), Shard(k)}, {Shard(k)}});
  per_dim.push_back({{Shard(1), Replicate()}, {Shard(nd)}});
  per_dim.push_back({{Shard(0), Replicate()}, {Partial()}});
  per_dim.push_back(replicate_all(2));
  add_linear_partials(per_dim, 2, 0);
  const DTensor inputs[] = {weight, indices};
  AppliedStrategy s = apply_strategy("embedding", inputs, expand_strategies(per_dim, weight.mesh().ndim()));
  const DTensor& w = s.inputs[0];
  const int64_t num_rows = weight.size(0);
  const LocalChunk chunk = w.spec().local_chunk();
  Tensor local = chunk.shape[0] == num_rows
                     ? embedding(w.to_local(), s.inputs[1].to_local())
                     : masked_lookup(w.to_local(), s.inputs[1].to_local(), chunk.offset[0], num_rows, weight, indices);
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.size(1));
  DTensor y = make_output(std::move(local), weight.mesh(), s.strategy.outputs[0], out_shape);
  record("embedding", s.inputs, std::span(&y, 1),
         [idx = s.inputs[1].detach(), num_rows](const std::vector<DTensor>& g) {
           return std::vector<DTensor>{embedding_backward(g[0], idx, num_rows), DTensor()};
         });
  return y;
}

}  // namespace dtr
