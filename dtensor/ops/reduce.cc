#include "dtensor/ops/reduce.h"

#include <algorithm>
#include <functional>
#include <numeric>

#include "dtensor/autograd.h"
#include "dtensor/internal/reduce_identity.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/view_ops.h"
#include "dtensor/ops/where.h"
#include "kernels/block_reduce.h"
#include "kernels/fill.h"

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

// What a reduction over sorted `dims` leaves: the output shape, and the candidates per
// mesh dim: Shard on a reduced dim -> `on_reduced`, Shard on a kept dim -> Shard at its
// output index, Replicate, and P(op) -> P(op) for each op in `partials`.
struct Reduction {
  Shape out_shape;
  std::vector<DimStrategy> per_dim;
};

Reduction plan_reduction(const DTensor& x, const std::vector<int64_t>& dims, KeepDim keepdim, Placement on_reduced,
                         std::span<const ReduceOp> partials) {
  Reduction r;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool reduced = std::binary_search(dims.begin(), dims.end(), d);
    if (reduced) {
      r.per_dim.push_back({{Shard(d)}, {on_reduced}});
      if (keepdim == KeepDim::kNo) continue;
    } else {
      r.per_dim.push_back({{Shard(d)}, {Shard(static_cast<int64_t>(r.out_shape.size()))}});
    }
    r.out_shape.push_back(reduced ? 1 : x.shape()[d]);
  }
  r.per_dim.push_back(replicate_all(1));
  for (ReduceOp op : partials) r.per_dim.push_back({{Partial(op)}, {Partial(op)}});
  return r;
}

// t with the reduced dims back as size 1 (as if reduced with keepdim).
DTensor with_reduced_dims(DTensor t, const std::vector<int64_t>& dims, KeepDim keepdim) {
  if (keepdim == KeepDim::kNo) {
    for (int64_t d : dims) t = unsqueeze(t, d);
  }
  return t;
}

// max or min (op kMax / kMin), as reduce.h and docs/sharding_rules.md describe.
DTensor extremum(std::string_view name, ReduceOp op, const DTensor& x, const std::vector<int64_t>& dims_given,
                 KeepDim keepdim) {
  const std::vector<int64_t> dims = reduced_dims(x, dims_given, name);
  DTR_CHECK(is_floating(x.dtype()), TypeError, "{}: {} is not floating; DTensor {} takes floating dtypes", name,
            describe(x), name);
  for (int64_t d : dims) {
    DTR_CHECK(x.shape()[d] > 0, ValueError, "{}: dim {} of {} is empty, and the {} of nothing is undefined", name, d,
              describe(x), name);
  }
  const ReduceOp ops[] = {op};
  const Reduction r = plan_reduction(x, dims, keepdim, Partial(op), ops);
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy(name, inputs, expand_strategies(r.per_dim, x.mesh().ndim()));
  const Tensor& local = s.inputs[0].to_local();
  const bool empty_shard = std::any_of(dims.begin(), dims.end(), [&](int64_t d) { return local.size(d) == 0; });
  Tensor y_local;
  if (empty_shard) {  // this rank holds none of the reduced elements: the identity of op
    DTensorSpec out_spec(x.mesh(), s.strategy.outputs[0], r.out_shape, x.dtype());
    y_local = internal::full_of_identity(out_spec.local_shape(), op, x.dtype(), x.dtype(), local.device());
  } else {
    y_local = op == ReduceOp::kMax ? max(local, dims, keepdim) : min(local, dims, keepdim);
  }
  DTensor y = make_output(std::move(y_local), x.mesh(), s.strategy.outputs[0], r.out_shape);
  if (needs_grad(s.inputs) && y.spec().has_partial()) {
    // Reduce now, as a move the rule promises, so that later ops never differentiate through it.
    Placements reduced = y.placements();
    std::replace_if(
        reduced.begin(), reduced.end(), [](const Placement& p) { return p.is_partial(); }, Replicate());
    const DTensor partial[] = {y};
    const OpStrategy to_reduced{{reduced}, {reduced}};
    y = apply_strategy(name, partial, std::span(&to_reduced, 1)).inputs[0];
  }
  record(std::string(name), s.inputs, std::span(&y, 1),
         [in = s.inputs[0].detach(), out = y.detach(), dims, keepdim](const std::vector<DTensor>& g) {
           // [in]: 1 where x attains the result, else 0.
           const DTensor hit = to(eq(in, with_reduced_dims(out, dims, keepdim)), in.dtype());
           // [in, reduced dims 1]: how many elements share the result.
           const DTensor ties = sum(hit, dims, KeepDim::kYes);
           // [in]: g shared equally among the ties.
           return std::vector<DTensor>{div(mul(with_reduced_dims(g[0], dims, keepdim), hit), ties)};
         });
  return y;
}

// The sum op over `dims` with the local sum `local_sum` computes (the kernel's, or the
// blocked one of sum_leading): placements, then the node [out] -> [in], the reduced dims
// put back as size 1 and broadcast along.
DTensor sum_of(const DTensor& x, const std::vector<int64_t>& dims, KeepDim keepdim,
               const std::function<Tensor(const Tensor&)>& local_sum) {
  const Reduction r = plan_reduction(x, dims, keepdim, Partial(), kLinearReduceOps);
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy("sum", inputs, expand_strategies(r.per_dim, x.mesh().ndim()));
  DTensor y = make_output(local_sum(s.inputs[0].to_local()), x.mesh(), s.strategy.outputs[0], r.out_shape);
  record("sum", s.inputs, std::span(&y, 1), [dims, keepdim, shape = x.shape()](const std::vector<DTensor>& g) {
    return std::vector<DTensor>{broadcast_to(with_reduced_dims(g[0], dims, keepdim), shape)};
  });
  return y;
}

}  // namespace

DTensor sum(const DTensor& x, const std::vector<int64_t>& dims_given, KeepDim keepdim) {
  const std::vector<int64_t> dims = reduced_dims(x, dims_given, "sum");
  return sum_of(x, dims, keepdim, [&](const Tensor& local) { return sum(local, dims, keepdim); });
}

DTensor sum_leading(const DTensor& x, int64_t lead) {
  std::vector<int64_t> dims(static_cast<size_t>(lead));
  std::iota(dims.begin(), dims.end(), int64_t{0});
  if (deterministic_block_tokens() == 0) return sum(x, dims);
  return sum_of(x, dims, KeepDim::kNo, [&](const Tensor& local) {
    const Tensor rows = local.flatten(0, lead - 1);
    return reduce_rows(rows.size(0), block_rows(local.shape(), lead, "sum over a batch"),
                       [&](int64_t first, int64_t n) { return std::vector{sum(rows.narrow(0, first, n), {0})}; })[0];
  });
}

DTensor mean(const DTensor& x, const std::vector<int64_t>& dims_given, KeepDim keepdim) {
  const std::vector<int64_t> dims = reduced_dims(x, dims_given, "mean");
  DTR_CHECK(is_floating(x.dtype()), TypeError, "mean: {} is not floating; convert it with to() first", describe(x));
  int64_t count = 1;
  for (int64_t d : dims) count *= x.shape()[d];
  return div(sum(x, dims, keepdim), static_cast<double>(count));
}

DTensor max(const DTensor& x, const std::vector<int64_t>& dims, KeepDim keepdim) {
  return extremum("max", ReduceOp::kMax, x, dims, keepdim);
}

DTensor min(const DTensor& x, const std::vector<int64_t>& dims, KeepDim keepdim) {
  return extremum("min", ReduceOp::kMin, x, dims, keepdim);
}

DTensor sum_of_squares(const DTensor& x, const std::vector<int64_t>& dims_given, KeepDim keepdim) {
  const std::vector<int64_t> dims = reduced_dims(x, dims_given, "sum_of_squares");
  const Reduction r = plan_reduction(x, dims, keepdim, Partial(), {});
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy("sum_of_squares", inputs, expand_strategies(r.per_dim, x.mesh().ndim()));
  DTensor y =
      make_output(sum_of_squares(s.inputs[0].to_local(), dims, keepdim), x.mesh(), s.strategy.outputs[0], r.out_shape);
  record("sum_of_squares", s.inputs, std::span(&y, 1),
         [in = s.inputs[0].detach(), dims, keepdim](const std::vector<DTensor>& g) {
           // [out] -> [in]: 2 x g, g broadcast back over the reduced dims.
           return std::vector<DTensor>{mul(mul(with_reduced_dims(g[0], dims, keepdim), in), 2.0)};
         });
  return y;
}

}  // namespace dtr
