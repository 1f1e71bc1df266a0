// Reductions on DTensors (the reduce family of kernels/reduce.h): differentiable, each with
// its sharding rule (PyTorch's _math_ops reductions).
//
// Rules, per mesh dim (a Shard on a kept dim stays, re-indexed without keepdim):
//   op             | S(reduced) ->   | R -> | P in -> out                     | why exact
//   sum            | P(sum)          | R    | P(sum|avg) -> same              | linear
//   mean           | P(sum)          | R    | P(sum|avg) -> same              | sum / GLOBAL count
//   max / min      | P(max) / P(min) | R    | P(max) / P(min) -> same         | max of maxes
//   sum_of_squares | P(sum)          | R    | none: P is reduced first        | not linear
// mean's terms are local sum / global count: exact for uneven shards (docs/sharding_rules.md).
#pragma once

#include <vector>

#include "dtensor/dtensor.h"
#include "kernels/reduce.h"

namespace dtr {

// Sum over `dims` (empty: every dim).
DTensor sum(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
// sum over the first `lead` dims, a batch's (a broadcast's gradient: a bias's, a position
// embedding's): under --deterministic a sum per sequence, combined in
// kernels/block_reduce.h's tree.
DTensor sum_leading(const DTensor& x, int64_t lead);
// Mean over `dims` (empty: every dim); floating dtypes. NaN over an empty dim.
DTensor mean(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
// Largest / smallest value over `dims` (torch.amax / amin); floating dtypes. ValueError
// over an empty dim. A sharded reduced dim gives P(max) / P(min), reduced at once when
// autograd records the op (its backward needs the reduced value).
DTensor max(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
DTensor min(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
// sum(x * x) over `dims` in one pass (gradient norms); floating dtypes.
DTensor sum_of_squares(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);

}  // namespace dtr
