// Reductions on DTensors: differentiable, each with its sharding rule (PyTorch's
// _math_ops reductions).
//
// Rules, per mesh dim (a Shard on a kept dim stays, re-indexed without keepdim):
//   op             | S(reduced) ->    | R -> | P in -> out                       | why exact
//   sum            | P(sum)           | R    | P(sum|avg) -> same                | linear
//   mean           | P(sum)           | R    | P(sum|avg) -> same                | sum / GLOBAL count
//   max / min      | P(max) / P(min)  | R    | P(max) -> P(max) / P(min) -> same | max of maxes
//   sum_of_squares | P(sum)           | R    | none: P is reduced first          | not linear
// mean is sum followed by a division by the global element count, so each rank's term is
// its local sum / N and the terms add up to the mean even for uneven shards; PyTorch keeps
// a local mean as P(avg) instead, which is exact only for even shards. A rank whose shard
// of a reduced dim is empty contributes max's identity (-inf; +inf for min). max/min stay
// Partial until a consumer needs the value, except when autograd records them: then the
// forward reduces them (all_reduce) so that the graph never differentiates through a
// P(max) -> R move (whose backward would need the reduced value). Backward: sum and mean
// broadcast the gradient back; max/min send it to the elements equal to the result, shared
// equally among ties (torch.amax); sum_of_squares gives 2 x g.
#pragma once

#include <vector>

#include "dtensor/dtensor.h"
#include "kernels/reduce.h"

namespace dtr {

// Sum over `dims` (empty: every dim).
DTensor sum(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
// Mean over `dims` (empty: every dim); floating dtypes. NaN over an empty dim.
DTensor mean(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
// Largest / smallest value over `dims` (torch.amax / amin); floating dtypes. ValueError
// over an empty dim.
DTensor max(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
DTensor min(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
// sum(x * x) over `dims` in one pass (gradient norms); floating dtypes.
DTensor sum_of_squares(const DTensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);

}  // namespace dtr
