// Pointwise arithmetic on DTensors, with numpy broadcasting: differentiable, each with
// its sharding rule (PyTorch's _pointwise_ops).
//
// Rules, per mesh dim: Shard along any output dim (inputs sharded on their matching dim,
// Replicate where broadcast), Replicate, and the Partial cases that are exact:
//   add/sub:      P(op), P(op) -> P(op)  for op in {sum, avg}   (sum of terms adds up)
//   mul/div:      P(op), R     -> P(op)  (mul also R, P -> P)   (a term times a constant)
//   x + scalar:   P(avg) -> P(avg) only (P(sum) would add the scalar once per term)
//   x * scalar:   P(op) -> P(op)
// Anything else with a Partial input reduces it first (all_reduce, or reduce_scatter
// when a Shard output is cheaper). Backward: the gradient summed over broadcast dims.
#pragma once

#include "dtensor/dtensor.h"

namespace dtr {

DTensor add(const DTensor& a, const DTensor& b);
DTensor sub(const DTensor& a, const DTensor& b);
DTensor mul(const DTensor& a, const DTensor& b);
DTensor div(const DTensor& a, const DTensor& b);
DTensor add(const DTensor& a, double b);
DTensor mul(const DTensor& a, double b);
DTensor neg(const DTensor& a);

// The gradient of a broadcast: g summed down to `shape` (numpy broadcasting in reverse).
DTensor sum_to_shape(const DTensor& g, const Shape& shape);

}  // namespace dtr
