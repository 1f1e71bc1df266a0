// Elementwise ops on DTensors, with numpy broadcasting: arithmetic, activations, their fused
// backward kernels and dtype casts, each with its sharding rule (PyTorch's _pointwise_ops).
//
// Rules, per mesh dim: Shard along any output dim (inputs sharded on their matching dim,
// Replicate where broadcast), Replicate, and these Partial cases (P(lin): sum or avg):
//   add/sub P(lin), P(lin);  mul/div P(lin), R (mul: also R, P(lin));  x + scalar P(avg) only
//   x * scalar, x / scalar, neg, *_backward(grad P(lin), saved R), to(x, floating): P kept
// Other ops are not linear: a Partial input is first reduced to Replicate or a Shard,
// whichever moves fewer bytes. The fused backward ops are not differentiable (no double
// backward). Why each rule is exact: docs/sharding_rules.md, "elementwise".
#pragma once

#include "dtensor/dtensor.h"
#include "kernels/elementwise.h"

namespace dtr {

DTensor add(const DTensor& a, const DTensor& b);
// a + b written over a's local part (torch's a.add_(b)), where nothing else holds a (as
// relu_, below) and b has a's shape and placements, none Partial: a residual add into its
// branch's output, which nothing reads after it. Returns a, now add's output in the graph;
// add(a, b), a untouched, where it cannot.
DTensor add_(const DTensor& a, const DTensor& b);
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
// relu(x) written over x's local part (torch's relu(x, inplace=True)), where nothing else
// holds x (DTensor::is_sole_owner: no other handle, view or saved copy) and x is neither a
// leaf that requires grad nor Partial: for a layer's input nothing reads after it, so that
// no second buffer of its size is allocated (a feed-forward's hidden activation). Returns x,
// now relu's output in the graph; relu(x), x untouched, where it cannot.
DTensor relu_(const DTensor& x);
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
