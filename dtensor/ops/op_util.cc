#include "dtensor/ops/op_util.h"

#include <algorithm>

namespace dtr {

DimStrategy shard_along(const std::vector<Shape>& input_shapes, const Shape& out_shape, int64_t out_dim,
                        int64_t split_factor) {
  DimStrategy s;
  const int64_t out_ndim = static_cast<int64_t>(out_shape.size());
  for (const Shape& in : input_shapes) {
    const int64_t d = out_dim - (out_ndim - static_cast<int64_t>(in.size()));
    const bool broadcast = d < 0 || in[d] != out_shape[out_dim];
    s.inputs.push_back(broadcast ? Replicate() : StridedShard(d, split_factor));
  }
  s.outputs.push_back(StridedShard(out_dim, split_factor));
  return s;
}

std::vector<DimStrategy> elementwise_strategies(const std::vector<Shape>& input_shapes, const Shape& out_shape,
                                                std::span<const ReduceOp> partial,
                                                std::span<const int64_t> split_factors) {
  std::vector<DimStrategy> out;
  for (int64_t d = 0; d < static_cast<int64_t>(out_shape.size()); ++d) {
    out.push_back(shard_along(input_shapes, out_shape, d));
    for (int64_t factor : split_factors) out.push_back(shard_along(input_shapes, out_shape, d, factor));
  }
  out.push_back(replicate_all(input_shapes.size()));
  for (ReduceOp op : partial) {
    out.push_back({std::vector<Placement>(input_shapes.size(), Partial(op)), {Partial(op)}});
  }
  return out;
}

std::vector<int64_t> strided_split_factors(std::span<const DTensor> inputs) {
  std::vector<int64_t> factors;
  for (const DTensor& t : inputs) {
    for (const Placement& p : t.placements()) {
      if (p.is_strided_shard() && std::find(factors.begin(), factors.end(), p.split_factor()) == factors.end()) {
        factors.push_back(p.split_factor());
      }
    }
  }
  return factors;
}

void add_linear_partials(std::vector<DimStrategy>& per_dim, size_t num_inputs, size_t linear_input,
                         size_t num_outputs) {
  for (ReduceOp r : kLinearReduceOps) {
    std::vector<Placement> inputs(num_inputs, Replicate());
    inputs[linear_input] = Partial(r);
    per_dim.push_back({std::move(inputs), std::vector<Placement>(num_outputs, Partial(r))});
  }
}

}  // namespace dtr
