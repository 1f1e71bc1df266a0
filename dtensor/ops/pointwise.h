// Pointwise ops on DTensors, with numpy broadcasting: arithmetic, activations and their
// fused backward kernels, dtype casts; differentiable, each with its sharding rule
// (PyTorch's _pointwise_ops).
//
// Rules, per mesh dim: Shard along any output dim (inputs sharded on their matching dim,
// Replicate where broadcast), Replicate, and the Partial cases that are exact:
//   op                          | Partial in -> out                  | why exact
//   add/sub(a, b)               | P(op), P(op) -> P(op), op sum|avg  | the terms add up
//   mul(a, b) / div(a, b)       | P(op), R -> P(op) (mul: also R, P) | a term times a constant
//   x + scalar                  | P(avg) -> P(avg) only              | P(sum) would add it k times
//   x * scalar, x / scalar, neg | P(op) -> P(op), op sum|avg         | linear
//   exp log sqrt rsqrt pow tanh | none: P is reduced first           | not linear
//   sigmoid relu gelu silu      | none: P is reduced first           | not linear
//   *_backward(grad, saved)     | P(op), R -> P(op), op sum|avg      | linear in grad
//   to(x, dtype)                | P(op) -> P(op) floating->floating  | each term rounds once
// A Partial input reduced first goes to the cheaper of Replicate (all_reduce) and a Shard
// of some dim (reduce_scatter), whichever moves fewer bytes. Backward: the gradient summed
// over broadcast dims; activations use the fused backward kernels, which are DTensor ops of
// their own (not differentiable: there is no double backward).
#pragma once

#include "dtensor/dtensor.h"
#include "kernels/elementwise.h"

namespace dtr {

DTensor add(const DTensor& a, const DTensor& b);
DTensor sub(const DTensor& a, const DTensor& b);
DTensor mul(const DTensor& a, const DTensor& b);
DTensor div(const DTensor& a, const DTensor& b);
DTensor add(const DTensor& a, double b);
DTensor mul(const DTensor& a, double b);
DTensor div(const DTensor& a, double b);
DTensor neg(const DTensor& a);

// --- unary, floating dtypes (relu: numeric) ---
DTensor exp(const DTensor& x);
DTensor log(const DTensor& x);
DTensor sqrt(const DTensor& x);
DTensor rsqrt(const DTensor& x);
// x ** exponent.
DTensor pow(const DTensor& x, double exponent);
DTensor tanh(const DTensor& x);
DTensor sigmoid(const DTensor& x);
DTensor relu(const DTensor& x);
DTensor gelu(const DTensor& x, GeluApproximation approximate = GeluApproximation::kNone);
DTensor silu(const DTensor& x);

// --- fused backward kernels (kernels/elementwise.h): grad_input from grad_output and the
// saved input x or output y. NotImplementedError when grad mode would record them ---
DTensor relu_backward(const DTensor& grad, const DTensor& x);
DTensor gelu_backward(const DTensor& grad, const DTensor& x, GeluApproximation approximate = GeluApproximation::kNone);
DTensor silu_backward(const DTensor& grad, const DTensor& x);
DTensor sigmoid_backward(const DTensor& grad, const DTensor& y);
DTensor tanh_backward(const DTensor& grad, const DTensor& y);

// x converted to dtype (torch's x.to(dtype)); differentiable between floating dtypes (the
// gradient is converted back), not from or to integer and bool dtypes.
DTensor to(const DTensor& x, DType dtype);

// The gradient of a broadcast: g summed down to `shape` (numpy broadcasting in reverse).
DTensor sum_to_shape(const DTensor& g, const Shape& shape);

}  // namespace dtr
