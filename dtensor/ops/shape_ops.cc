#include "dtensor/ops/shape_ops.h"

#include <algorithm>
#include <numeric>

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "kernels/shape_ops.h"

namespace dtr {
namespace {

// The candidates of an op joining or cutting along `dim` (see the header's table), for
// num_inputs inputs and num_outputs outputs of ndim dims.
std::vector<DimStrategy> along_dim_strategies(int64_t ndim, int64_t dim, size_t num_inputs, size_t num_outputs) {
  std::vector<DimStrategy> out;
  for (int64_t k = 0; k < ndim; ++k) {
    if (k != dim) {
      out.push_back({std::vector<Placement>(num_inputs, Shard(k)), std::vector<Placement>(num_outputs, Shard(k))});
    }
  }
  out.push_back(replicate_all(num_inputs, num_outputs));
  for (ReduceOp op : kAllReduceOps) {
    out.push_back({std::vector<Placement>(num_inputs, Partial(op)), std::vector<Placement>(num_outputs, Partial(op))});
  }
  return out;
}

// Whether `sizes` are n > 1 equal pieces: then a StridedShard(dim, n) of their join holds
// its chunk of each piece, and the pieces are each Shard(dim) (the strided rule).
bool equal_pieces(const std::vector<int64_t>& sizes) {
  return sizes.size() > 1 && std::all_of(sizes.begin(), sizes.end(), [&](int64_t s) { return s == sizes[0]; });
}

// The strided rule: StridedShard(dim, n) of the join <-> Shard(dim) of each of n equal pieces.
DimStrategy strided_join(int64_t dim, size_t pieces, bool joining) {
  const std::vector<Placement> joined = {StridedShard(dim, static_cast<int64_t>(pieces))};
  const std::vector<Placement> each(pieces, Shard(dim));
  return joining ? DimStrategy{each, joined} : DimStrategy{joined, each};
}

// dim wrapped for x, which must have a dim to cut.
int64_t cut_dim(std::string_view op, const DTensor& x, int64_t dim) {
  DTR_CHECK(x.dim() > 0, IndexError, "{}: {} is 0-d and has no dim to cut", op, describe(x));
  return wrap_dim(dim, x.dim(), op);
}

// x cut into pieces of `sizes` along dim (wrapped; sizes checked), recorded as `op`.
std::vector<DTensor> split_checked(std::string_view op, const DTensor& x, const std::vector<int64_t>& sizes,
                                   int64_t dim) {
  const DTensor inputs[] = {x};
  std::vector<DimStrategy> per_dim = along_dim_strategies(x.dim(), dim, 1, sizes.size());
  if (equal_pieces(sizes)) per_dim.push_back(strided_join(dim, sizes.size(), false));
  AppliedStrategy s = apply_strategy(op, inputs, expand_strategies(per_dim, x.mesh().ndim()));
  // dim is whole here but under the strided rule, so the local pieces have the global sizes
  // along it, or equal local sizes (each its chunk of one piece).
  const int64_t local_size = s.inputs[0].to_local().size(dim);
  std::vector<int64_t> local_sizes = sizes;
  if (local_size != x.shape()[dim]) {
    std::fill(local_sizes.begin(), local_sizes.end(), local_size / static_cast<int64_t>(sizes.size()));
  }
  std::vector<Tensor> pieces = split(s.inputs[0].to_local(), std::span(local_sizes), dim);
  std::vector<DTensor> out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Shape shape = x.shape();
    shape[dim] = sizes[i];
    out.push_back(make_output(std::move(pieces[i]), x.mesh(), s.strategy.outputs[i], std::move(shape)));
  }
  record(std::string(op), s.inputs, out,
         [dim](const std::vector<DTensor>& g) { return std::vector<DTensor>{cat(g, dim)}; });
  return out;
}

}  // namespace

DTensor cat(const std::vector<DTensor>& tensors, int64_t dim) {
  DTR_CHECK(!tensors.empty(), ValueError, "cat: no tensors given");
  std::vector<std::string> described;
  for (const DTensor& t : tensors) described.push_back(describe(t));
  const DTensor& first = tensors.front();
  DTR_CHECK(first.dim() > 0, ValueError, "cat: 0-d tensors cannot be concatenated: {}", described);
  dim = wrap_dim(dim, first.dim(), "cat");
  std::vector<int64_t> sizes;
  for (const DTensor& t : tensors) {
    DTR_CHECK(t.dtype() == first.dtype(), TypeError, "cat: dtypes differ in {}; convert them with to() first",
              described);
    bool fits = t.dim() == first.dim();
    for (int64_t d = 0; d < first.dim() && fits; ++d) fits = d == dim || t.shape()[d] == first.shape()[d];
    DTR_CHECK(fits, ValueError, "cat: {} must have one ndim and equal sizes except along dim {}", described, dim);
    sizes.push_back(t.shape()[dim]);
  }
  Shape out_shape = first.shape();
  out_shape[dim] = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  std::vector<DimStrategy> per_dim = along_dim_strategies(first.dim(), dim, tensors.size(), 1);
  if (equal_pieces(sizes)) per_dim.push_back(strided_join(dim, sizes.size(), true));
  AppliedStrategy s = apply_strategy("cat", tensors, expand_strategies(per_dim, first.mesh().ndim()));
  std::vector<Tensor> locals;
  for (const DTensor& t : s.inputs) locals.push_back(t.to_local());
  DTensor y = make_output(cat(locals, dim), first.mesh(), s.strategy.outputs[0], out_shape);
  record("cat", s.inputs, std::span(&y, 1),
         [sizes, dim](const std::vector<DTensor>& g) { return split(g[0], sizes, dim); });
  return y;
}

std::vector<DTensor> split(const DTensor& x, int64_t split_size, int64_t dim) {
  dim = cut_dim("split", x, dim);
  const int64_t n = x.shape()[dim];
  DTR_CHECK(split_size > 0 || (n == 0 && split_size == 0), ValueError,
            "split: split_size {} for dim {} of {}; it must be positive", split_size, dim, describe(x));
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n; at += split_size) sizes.push_back(std::min(split_size, n - at));
  if (n == 0) sizes.push_back(0);
  return split_checked("split", x, sizes, dim);
}

std::vector<DTensor> split(const DTensor& x, const std::vector<int64_t>& split_sizes, int64_t dim) {
  dim = cut_dim("split", x, dim);
  const bool valid = std::all_of(split_sizes.begin(), split_sizes.end(), [](int64_t s) { return s >= 0; }) &&
                     std::accumulate(split_sizes.begin(), split_sizes.end(), int64_t{0}) == x.shape()[dim];
  DTR_CHECK(valid, ValueError, "split: sizes {} must be non-negative and sum to {}, the size of dim {} of {}",
            split_sizes, x.shape()[dim], dim, describe(x));
  return split_checked("split", x, split_sizes, dim);
}

std::vector<DTensor> chunk(const DTensor& x, int64_t chunks, int64_t dim) {
  dim = cut_dim("chunk", x, dim);
  DTR_CHECK(chunks > 0, ValueError, "chunk: {} chunks of {}; it must be positive", chunks, describe(x));
  const int64_t n = x.shape()[dim];
  std::vector<int64_t> sizes = chunk_sizes(n, chunks);
  if (n > 0) sizes.erase(std::find(sizes.begin(), sizes.end(), 0), sizes.end());  // torch.chunk drops empty tails
  return split_checked("chunk", x, sizes, dim);
}

DTensor narrow(const DTensor& x, int64_t dim, int64_t start, int64_t length) {
  dim = cut_dim("narrow", x, dim);
  const int64_t n = x.shape()[dim];
  DTR_CHECK(start >= 0 && length >= 0 && start + length <= n, IndexError,
            "narrow: start {} + length {} exceeds size {} of dim {} of {}", start, length, n, dim, describe(x));
  // The middle of three pieces; the engine gives the other two zero gradients.
  return split_checked("narrow", x, {start, length, n - start - length}, dim)[1];
}

}  // namespace dtr
