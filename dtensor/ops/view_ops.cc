#include "dtensor/ops/view_ops.h"

#include <algorithm>
#include <numeric>

#include "dtensor/autograd.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/reduce.h"

namespace dtr {
namespace {

// Placements that a view leaves alone: Replicate, and every Partial (no data changes).
void add_unchanged(std::vector<DimStrategy>& per_dim) {
  per_dim.push_back(replicate_all(1));
  for (ReduceOp r : kAllReduceOps) per_dim.push_back({{Partial(r)}, {Partial(r)}});
}

// Removes the size-1 dims `removed` (sorted); the backward puts them back.
DTensor squeeze_dims(const DTensor& x, const std::vector<int64_t>& removed) {
  auto is_removed = [&](int64_t d) { return std::binary_search(removed.begin(), removed.end(), d); };
  Shape out_shape;
  std::vector<DimStrategy> per_dim;
  for (int64_t k = 0; k < x.dim(); ++k) {
    if (is_removed(k)) continue;
    per_dim.push_back({{Shard(k)}, {Shard(static_cast<int64_t>(out_shape.size()))}});
    out_shape.push_back(x.shape()[k]);
  }
  add_unchanged(per_dim);
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy("squeeze", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  Tensor local = s.inputs[0].to_local();
  for (auto d = removed.rbegin(); d != removed.rend(); ++d) local = local.squeeze(*d);
  DTensor y = make_output(std::move(local), x.mesh(), s.strategy.outputs[0], out_shape);
  record("squeeze", s.inputs, std::span(&y, 1), [removed](const std::vector<DTensor>& g) {
    DTensor grad = g[0];
    for (int64_t d : removed) grad = unsqueeze(grad, d);
    return std::vector<DTensor>{grad};
  });
  return y;
}

// The global elements one rank's chunk covers, as runs of flat indices merged as far as they
// go, outermost first: an inner run covering its whole dim, or an outer run of one index,
// merges with its neighbour into one run over the product of the two dims. What is left is
// one distinct gap pattern per run, so two chunks of tensors with equal numel cover the same
// elements exactly when their merged runs are equal. Every empty chunk is {{0, 0, 0}}; the
// runs start from an outer run {1, 0, 1}, so that 0-d and size-1 dims merge away.
struct Run {
  int64_t size, start, stop;
  friend bool operator==(const Run&, const Run&) = default;
};

std::vector<Run> merged_runs(const Shape& shape, const LocalChunk& chunk) {
  std::vector<Run> runs{{1, 0, 1}};
  for (size_t d = 0; d < shape.size(); ++d) {
    if (chunk.shape[d] == 0) return {{0, 0, 0}};
    Run r{shape[d], chunk.offset[d], chunk.offset[d] + chunk.shape[d]};
    while (!runs.empty() && ((r.start == 0 && r.stop == r.size) || runs.back().stop - runs.back().start == 1)) {
      const Run outer = runs.back();
      runs.pop_back();
      r = {outer.size * r.size, outer.start * r.size + r.start,
           (r.start == 0 && r.stop == r.size) ? outer.stop * r.size : outer.start * r.size + r.stop};
    }
    runs.push_back(r);
  }
  return runs;
}

// Whether every rank holds the same global elements of x under `in` as of the reshaped
// tensor under `out`. Partial placements chunk nothing, so they count as Replicate.
bool same_elements(const DTensor& x, const Placements& in, const Shape& shape, const Placements& out) {
  auto boxes_of = [](Placements p) {
    std::replace_if(
        p.begin(), p.end(), [](const Placement& q) { return q.is_partial(); }, Replicate());
    return p;
  };
  const DTensorSpec in_spec(x.mesh(), boxes_of(in), x.shape(), x.dtype());
  const DTensorSpec out_spec(x.mesh(), boxes_of(out), shape, x.dtype());
  for (int64_t i = 0; i < x.mesh().size(); ++i) {
    const std::vector<int64_t> coord = x.mesh().coordinate_at(i);
    if (merged_runs(x.shape(), in_spec.local_chunk(coord)) != merged_runs(shape, out_spec.local_chunk(coord)))
      return false;
  }
  return true;
}

// Whether reshaping the local data may copy it (reshape) or must view it (view).
enum class LocalCopy : uint8_t { kNever, kIfNeeded };

DTensor reshape_as(std::string_view op, const DTensor& x, const Shape& requested, LocalCopy copy) {
  const Shape shape = infer_shape(requested, x.numel(), op);
  // S(k) -> S(j) for dims that start at the same flat offset.
  std::vector<DimStrategy> per_dim;
  int64_t in_prefix = 1;
  for (int64_t k = 0; k < x.dim(); ++k) {
    int64_t out_prefix = 1;
    for (size_t j = 0; j < shape.size(); ++j) {
      if (out_prefix == in_prefix) per_dim.push_back({{Shard(k)}, {Shard(static_cast<int64_t>(j))}});
      out_prefix *= shape[j];
    }
    in_prefix *= x.shape()[k];
  }
  add_unchanged(per_dim);
  std::vector<OpStrategy> candidates;
  for (OpStrategy& c : expand_strategies(per_dim, x.mesh().ndim())) {
    const bool sharded =
        std::any_of(c.inputs[0].begin(), c.inputs[0].end(), [](const Placement& p) { return p.is_shard(); });
    if (!sharded || same_elements(x, c.inputs[0], shape, c.outputs[0])) candidates.push_back(std::move(c));
  }
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy(op, inputs, candidates);
  const DTensorSpec out_spec(x.mesh(), s.strategy.outputs[0], shape, x.dtype());
  const Tensor& local = s.inputs[0].to_local();
  const Shape local_shape = out_spec.local_shape();
  DTensor y(copy == LocalCopy::kNever ? local.view(local_shape) : local.reshape(local_shape), out_spec);
  record(std::string(op), s.inputs, std::span(&y, 1), [in_shape = x.shape()](const std::vector<DTensor>& g) {
    return std::vector<DTensor>{reshape(g[0], in_shape)};
  });
  return y;
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
  record("unsqueeze", s.inputs, std::span(&y, 1),
         [dim](const std::vector<DTensor>& g) { return std::vector<DTensor>{sum(g[0], {dim}, KeepDim::kNo)}; });
  return y;
}

DTensor squeeze(const DTensor& x, int64_t dim) {
  dim = wrap_dim(dim, x.dim(), "squeeze");
  if (x.dim() == 0 || x.shape()[dim] != 1) return squeeze_dims(x, {});
  return squeeze_dims(x, {dim});
}

DTensor squeeze(const DTensor& x) {
  std::vector<int64_t> removed;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (x.shape()[d] == 1) removed.push_back(d);
  }
  return squeeze_dims(x, removed);
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
  record("transpose", s.inputs, std::span(&y, 1),
         [dim0, dim1](const std::vector<DTensor>& g) { return std::vector<DTensor>{transpose(g[0], dim0, dim1)}; });
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
  DTensor y(s.inputs[0].to_local().expand(out_spec.local_shape()), out_spec);
  record("broadcast_to", s.inputs, std::span(&y, 1),
         [xs = x.shape()](const std::vector<DTensor>& g) { return std::vector<DTensor>{sum_to_shape(g[0], xs)}; });
  return y;
}

DTensor permute(const DTensor& x, const std::vector<int64_t>& dims_given) {
  std::vector<int64_t> dims;
  for (int64_t d : dims_given) dims.push_back(wrap_dim(d, x.dim(), "permute"));
  std::vector<int64_t> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(x.dim());
  std::iota(identity.begin(), identity.end(), 0);
  DTR_CHECK(sorted == identity, ValueError, "permute: {} is not a permutation of the {} dims of {}", dims_given,
            x.dim(), describe(x));
  Shape out_shape;
  std::vector<int64_t> inverse(x.dim());
  std::vector<DimStrategy> per_dim;
  for (int64_t i = 0; i < x.dim(); ++i) {
    out_shape.push_back(x.shape()[dims[i]]);
    inverse[dims[i]] = i;
    per_dim.push_back({{Shard(dims[i])}, {Shard(i)}});
  }
  add_unchanged(per_dim);
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy("permute", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  DTensor y = make_output(s.inputs[0].to_local().permute(dims), x.mesh(), s.strategy.outputs[0], out_shape);
  record("permute", s.inputs, std::span(&y, 1),
         [inverse](const std::vector<DTensor>& g) { return std::vector<DTensor>{permute(g[0], inverse)}; });
  return y;
}

DTensor view(const DTensor& x, const Shape& shape) { return reshape_as("view", x, shape, LocalCopy::kNever); }

DTensor reshape(const DTensor& x, const Shape& shape) { return reshape_as("reshape", x, shape, LocalCopy::kIfNeeded); }

DTensor flatten(const DTensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  start_dim = wrap_dim(start_dim, x.dim(), "flatten");
  end_dim = wrap_dim(end_dim, x.dim(), "flatten");
  DTR_CHECK(start_dim <= end_dim, ValueError, "flatten: start_dim {} > end_dim {} for {}", start_dim, end_dim,
            describe(x));
  const Shape& in = x.shape();
  Shape shape(in.begin(), in.begin() + start_dim);
  shape.push_back(shape_numel(std::span(in).subspan(start_dim, end_dim - start_dim + 1)));
  shape.insert(shape.end(), in.begin() + end_dim + 1, in.end());
  return reshape(x, shape);
}

}  // namespace dtr
