#include "dtensor/ops/view_ops.h"

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/pointwise.h"
#include "dtensor/ops/reduction.h"

namespace dtr {
namespace {

constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

// Placements that a view leaves alone: Replicate, and every Partial (no data changes).
void add_unchanged(std::vector<DimStrategy>& per_dim) {
  per_dim.push_back(replicate_all(1));
  for (ReduceOp r : kAllOps) per_dim.push_back({{Partial(r)}, {Partial(r)}});
}

}  // namespace

DTensor unsqueeze(const DTensor& x, int64_t dim) {
  dim = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape out_shape = x.shape();
  out_shape.insert(out_shape.begin() + dim, 1);
  std::vector<DimStrategy> per_dim;
  for (int64_t k = 0; k < x.dim(); ++k) per_dim.push_back({{Shard(k)}, {Shard(k >= dim ? k + 1 : k)}});
  add_unchanged(per_dim);
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy("unsqueeze", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  DTensor y = make_output(s.inputs[0].to_local().unsqueeze(dim), x.mesh(), s.strategy.outputs[0], out_shape);
  record("unsqueeze", s.inputs, std::span(&y, 1), [dim](const std::vector<DTensor>& g) {
    return std::vector<DTensor>{sum(g[0], {dim}, KeepDim::kNo)};
  });
  return y;
}

DTensor transpose(const DTensor& x, int64_t dim0, int64_t dim1) {
  dim0 = wrap_dim(dim0, x.dim(), "transpose");
  dim1 = wrap_dim(dim1, x.dim(), "transpose");
  Shape out_shape = x.shape();
  std::swap(out_shape[dim0], out_shape[dim1]);
  std::vector<DimStrategy> per_dim;
  for (int64_t k = 0; k < x.dim(); ++k) {
    per_dim.push_back({{Shard(k)}, {Shard(k == dim0 ? dim1 : k == dim1 ? dim0 : k)}});
  }
  add_unchanged(per_dim);
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy("transpose", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  DTensor y = make_output(s.inputs[0].to_local().transpose(dim0, dim1), x.mesh(), s.strategy.outputs[0], out_shape);
  record("transpose", s.inputs, std::span(&y, 1), [dim0, dim1](const std::vector<DTensor>& g) {
    return std::vector<DTensor>{transpose(g[0], dim0, dim1)};
  });
  return y;
}

DTensor broadcast_to(const DTensor& x, const Shape& shape) {
  const Shape checked = broadcast_shapes(x.shape(), shape, "broadcast_to");
  DTR_CHECK(checked == shape, ValueError, "broadcast_to: {} cannot be broadcast to {}", describe(x), shape);
  const int64_t lead = static_cast<int64_t>(shape.size()) - x.dim();
  std::vector<DimStrategy> per_dim;
  for (int64_t k = 0; k < x.dim(); ++k) {
    if (x.shape()[k] == shape[k + lead]) per_dim.push_back({{Shard(k)}, {Shard(k + lead)}});
  }
  add_unchanged(per_dim);
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy("broadcast_to", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  DTensorSpec out_spec(x.mesh(), s.strategy.outputs[0], shape, x.dtype());
  DTensor y(s.inputs[0].to_local().expand(out_spec.local_box().shape), out_spec);
  record("broadcast_to", s.inputs, std::span(&y, 1), [xs = x.shape()](const std::vector<DTensor>& g) {
    return std::vector<DTensor>{sum_to_shape(g[0], xs)};
  });
  return y;
}

}  // namespace dtr
