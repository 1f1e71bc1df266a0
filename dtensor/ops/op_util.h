// Helpers every DTensor op shares: wrapping a local result as an output DTensor, and
// the per-mesh-dim strategies that recur across op families.
#pragma once

#include <vector>

#include "dtensor/dtensor.h"
#include "dtensor/sharding_strategy.h"

namespace dtr {

// Every reduce op a Partial can carry, and the linear ones: an op linear in one input keeps
// those, since the sum (or mean) of its terms' results is its result on the sum (or mean).
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
inline constexpr ReduceOp kLinearReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg};

// The output of an op: `local` is this rank's part of a tensor of global `shape` under
// `placements` on `mesh`.
inline DTensor make_output(Tensor local, const DeviceMesh& mesh, Placements placements, Shape shape) {
  DType dtype = local.dtype();
  return DTensor(std::move(local), DTensorSpec(mesh, std::move(placements), std::move(shape), dtype));
}

// Every input and the output Replicate: always legal, and the most expensive.
inline DimStrategy replicate_all(size_t num_inputs, size_t num_outputs = 1) {
  return {std::vector<Placement>(num_inputs, Replicate()), std::vector<Placement>(num_outputs, Replicate())};
}

// For an op applied independently to every element (or every slice) along output dim
// `out_dim`: each input is sharded on its own matching dim, or Replicate where it is
// broadcast (size 1 or absent), and the output is Shard(out_dim); with split_factor s > 1,
// StridedShard(dim, s) in place of Shard(dim) (rows chosen by the dim's size alone, so
// inputs and output agree).
DimStrategy shard_along(const std::vector<Shape>& input_shapes, const Shape& out_shape, int64_t out_dim,
                        int64_t split_factor = 1);

// The candidates of an elementwise op with broadcasting: Shard along every output dim,
// then Replicate; `partial` adds (P(op) for every input -> P(op)) for each op given;
// `split_factors` adds StridedShard along every output dim for each factor given (an op
// that reads global indices, as dropout does, gives none).
std::vector<DimStrategy> elementwise_strategies(const std::vector<Shape>& input_shapes, const Shape& out_shape,
                                                std::span<const ReduceOp> partial = {},
                                                std::span<const int64_t> split_factors = {});

// The distinct split factors of the StridedShard placements of `inputs`, in order of
// appearance: what an elementwise op keeps (packed q, k, v under tensor parallelism, FSDP's
// chunks of them) instead of moving them to a Shard.
std::vector<int64_t> strided_split_factors(std::span<const DTensor> inputs);

// For an op linear in input `linear_input` when the others are fixed: appends (that input
// P(op), the others R -> every output P(op)) for op in kLinearReduceOps.
void add_linear_partials(std::vector<DimStrategy>& per_dim, size_t num_inputs, size_t linear_input,
                         size_t num_outputs = 1);

}  // namespace dtr
