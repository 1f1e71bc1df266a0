// Selection and comparison on DTensors: where, masked_fill, eq/ne/lt/le/gt/ge and
// logical_not, with numpy broadcasting (PyTorch's names and semantics).
//
// Rules, per mesh dim: Shard along any output dim (each operand sharded on its matching
// dim, Replicate where broadcast), Replicate, and the Partial cases that are exact:
//   where(cond, a, b)         R, P(op), P(op) -> P(op), any op (it picks term by term)
//   masked_fill(x, mask, v)   P(op), R -> P(op) for avg, max, min; for sum only when v == 0
//   comparisons, logical_not  none: P is reduced first (they need the real value)
// Conditions and masks are bool (TypeError otherwise), never Partial. where is
// differentiable in a and b, masked_fill in x; comparisons and logical_not are not.
#pragma once

#include "dtensor/dtensor.h"

namespace dtr {

// cond ? a : b elementwise; cond bool, a and b of one dtype, all three broadcast.
DTensor where(const DTensor& cond, const DTensor& a, const DTensor& b);
// mask ? value : x; mask bool, broadcast with x.
DTensor masked_fill(const DTensor& x, const DTensor& mask, double value);

// Elementwise comparisons: bool outputs, operands of one dtype broadcast.
DTensor eq(const DTensor& a, const DTensor& b);
DTensor ne(const DTensor& a, const DTensor& b);
DTensor lt(const DTensor& a, const DTensor& b);
DTensor le(const DTensor& a, const DTensor& b);
DTensor gt(const DTensor& a, const DTensor& b);
DTensor ge(const DTensor& a, const DTensor& b);
// With a scalar (first rounded to a's dtype, as torch does).
DTensor eq(const DTensor& a, double b);
DTensor ne(const DTensor& a, double b);
DTensor lt(const DTensor& a, double b);
DTensor le(const DTensor& a, double b);
DTensor gt(const DTensor& a, double b);
DTensor ge(const DTensor& a, double b);
// x == 0 as bool, any dtype.
DTensor logical_not(const DTensor& x);

}  // namespace dtr
