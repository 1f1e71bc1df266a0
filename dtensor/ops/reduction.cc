#include "dtensor/ops/reduction.h"

#include <algorithm>

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/view_ops.h"

namespace dtr {
namespace {

// dims wrapped, sorted and checked for repeats; every dim when empty.
std::vector<int64_t> reduced_dims(const DTensor& x, const std::vector<int64_t>& dims, std::string_view op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, x.dim(), op));
  std::sort(out.begin(), out.end());
  DTR_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), ValueError, "{}: dim repeated in {} for {}", op,
            dims, describe(x));
  return out;
}

}  // namespace

DTensor sum(const DTensor& x, const std::vector<int64_t>& dims_given, KeepDim keepdim) {
  const std::vector<int64_t> dims = reduced_dims(x, dims_given, "sum");
  auto reduced = [&](int64_t d) { return std::binary_search(dims.begin(), dims.end(), d); };
  Shape out_shape;
  std::vector<int64_t> new_index(x.dim(), -1);  // output dim of each kept input dim
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced(d) && keepdim == KeepDim::kNo) continue;
    new_index[d] = static_cast<int64_t>(out_shape.size());
    out_shape.push_back(reduced(d) ? 1 : x.shape()[d]);
  }
  std::vector<DimStrategy> per_dim;
  for (int64_t d = 0; d < x.dim(); ++d) {
    per_dim.push_back({{Shard(d)}, {reduced(d) ? Partial() : Shard(new_index[d])}});
  }
  per_dim.push_back(replicate_all(1));
  for (ReduceOp r : {ReduceOp::kSum, ReduceOp::kAvg}) per_dim.push_back({{Partial(r)}, {Partial(r)}});
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy("sum", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  DTensor y = make_output(sum(s.inputs[0].to_local(), dims, keepdim), x.mesh(), s.strategy.outputs[0], out_shape);
  record("sum", s.inputs, std::span(&y, 1), [dims, keepdim, shape = x.shape()](const std::vector<DTensor>& g) {
    // [out] -> [in]: put the reduced dims back as size 1, then broadcast along them.
    DTensor grad = g[0];
    if (keepdim == KeepDim::kNo) {
      for (int64_t d : dims) grad = unsqueeze(grad, d);
    }
    return std::vector<DTensor>{broadcast_to(grad, shape)};
  });
  return y;
}

}  // namespace dtr
