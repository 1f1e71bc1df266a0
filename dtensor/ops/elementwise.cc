#include "dtensor/ops/elementwise.h"

#include <array>

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/reduce.h"
#include "kernels/elementwise.h"
#include "kernels/relu_mask.h"

namespace dtr {
namespace {

// Which Partial inputs a binary op accepts without reducing them.
enum class BinaryPartials : uint8_t {
  kBoth,   // add, sub: P(op), P(op) -> P(op)
  kLeft,   // div: P(op), R -> P(op)
  kEither  // mul: P(op), R -> P(op) and R, P(op) -> P(op)
};

AppliedStrategy choose_binary(std::string_view op, const DTensor& a, const DTensor& b, const Shape& out,
                              BinaryPartials partials) {
  const DTensor inputs[] = {a, b};
  std::vector<DimStrategy> per_dim = elementwise_strategies(
      {a.shape(), b.shape()}, out, partials == BinaryPartials::kBoth ? kLinearReduceOps : std::span<const ReduceOp>{},
      strided_split_factors(inputs));
  if (partials != BinaryPartials::kBoth) {
    for (ReduceOp r : kLinearReduceOps) {
      per_dim.push_back({{Partial(r), Replicate()}, {Partial(r)}});
      if (partials == BinaryPartials::kEither) per_dim.push_back({{Replicate(), Partial(r)}, {Partial(r)}});
    }
  }
  return apply_strategy(op, inputs, expand_strategies(per_dim, a.mesh().ndim()));
}

// The tensors a binary op's backward reads besides the output gradient and the inputs'
// shapes. Only these are saved: a residual add that held its inputs would keep the branch's
// output alive until backward.
struct BinarySaves {
  bool a = false, b = false, out = false;
};

// What a binary op's backward gets: the inputs' shapes, and the tensors its BinarySaves
// named (as moved, detached; undefined where not named).
struct BinarySaved {
  Shape a_shape, b_shape;
  DTensor a, b, out;
};

// Runs a binary op: chooses placements, applies `kernel` to the locals, records `backward`
// (which receives the BinarySaved that `saves` asks for).
template <class Kernel, class Backward>
DTensor binary(std::string_view op, const DTensor& a, const DTensor& b, BinaryPartials partials, BinarySaves saves,
               Kernel kernel, Backward backward) {
  const Shape out = broadcast_shapes(a.shape(), b.shape(), op);
  AppliedStrategy s = choose_binary(op, a, b, out, partials);
  DTensor y = make_output(kernel(s.inputs[0].to_local(), s.inputs[1].to_local()), a.mesh(), s.strategy.outputs[0], out);
  BinarySaved saved{.a_shape = a.shape(), .b_shape = b.shape()};
  if (saves.a) saved.a = s.inputs[0].detach();
  if (saves.b) saved.b = s.inputs[1].detach();
  if (saves.out) saved.out = y.detach();
  record(std::string(op), s.inputs, std::span(&y, 1),
         [saved = std::move(saved), backward](const std::vector<DTensor>& g) { return backward(g[0], saved); });
  return y;
}

// Whether an in-place op (relu_, add_) may write over t's local part: nothing else holds it
// (no other handle, view or saved copy), it is not a leaf that requires grad (whose value
// is the parameter's), and it is contiguous and not Partial.
bool overwritable(const DTensor& t) {
  return t.is_sole_owner() && !(t.is_leaf() && t.requires_grad()) && !t.spec().has_partial() &&
         t.to_local().is_contiguous();
}

// What a unary op's backward reads besides the output gradient.
enum class Saves : uint8_t { kNothing, kInput, kOutput };

// An op of one tensor (and scalars) up to its output: `partials` lists the Partial ops it
// keeps; the input as moved goes to `moved`.
template <class Kernel>
DTensor unary_forward(std::string_view op, const DTensor& x, std::span<const ReduceOp> partials, Kernel kernel,
                      DTensor& moved) {
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy(
      op, inputs,
      expand_strategies(elementwise_strategies({x.shape()}, x.shape(), partials, strided_split_factors(inputs)),
                        x.mesh().ndim()));
  moved = s.inputs[0];
  return make_output(kernel(moved.to_local()), x.mesh(), s.strategy.outputs[0], x.shape());
}

// Runs an op of one tensor (and scalars) and records it: backward(g, saved) gets the input or
// the output as `saves` says, detached.
template <class Kernel, class Backward>
DTensor unary(std::string_view op, const DTensor& x, std::span<const ReduceOp> partials, Saves saves, Kernel kernel,
              Backward backward) {
  DTensor moved;
  DTensor y = unary_forward(op, x, partials, kernel, moved);
  DTensor saved;
  if (saves == Saves::kInput) saved = moved.detach();
  if (saves == Saves::kOutput) saved = y.detach();
  record(std::string(op), std::span(&moved, 1), std::span(&y, 1),
         [saved, backward](const std::vector<DTensor>& g) { return std::vector<DTensor>{backward(g[0], saved)}; });
  return y;
}

// Runs a fused backward kernel: linear in `grad`, so a Partial grad times a Replicate
// saved tensor stays Partial. It records nothing (there is no double backward).
template <class Kernel>
DTensor fused_backward(std::string_view op, const DTensor& grad, const DTensor& saved, Kernel kernel) {
  const DTensor inputs[] = {grad, saved};
  DTR_CHECK(!needs_grad(inputs), NotImplementedError,
            "{}: called on {} and {} with grad mode on and an input requiring grad, but {} is not differentiable "
            "(no double backward); call it under NoGradGuard or on detached tensors",
            op, describe(grad), describe(saved), op);
  const Shape out = broadcast_shapes(grad.shape(), saved.shape(), op);
  AppliedStrategy s = choose_binary(op, grad, saved, out, BinaryPartials::kLeft);
  return make_output(kernel(s.inputs[0].to_local(), s.inputs[1].to_local()), grad.mesh(), s.strategy.outputs[0], out);
}

}  // namespace

DTensor sum_to_shape(const DTensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  DTensor r = lead > 0 ? sum_leading(g, lead) : g;
  std::vector<int64_t> ones;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (shape[d] == 1 && r.shape()[d] != 1) ones.push_back(d);
  }
  return ones.empty() ? r : sum(r, ones, KeepDim::kYes);
}

DTensor add(const DTensor& a, const DTensor& b) {
  return binary(
      "add", a, b, BinaryPartials::kBoth, {}, [](const Tensor& x, const Tensor& y) { return add(x, y); },
      [](const DTensor& g, const BinarySaved& s) {
        return std::vector<DTensor>{sum_to_shape(g, s.a_shape), sum_to_shape(g, s.b_shape)};
      });
}

DTensor add_(const DTensor& a, const DTensor& b) {
  if (!overwritable(a) || b.shape() != a.shape() || b.mesh() != a.mesh() || b.placements() != a.placements() ||
      b.dtype() != a.dtype()) {
    return add(a, b);
  }
  Tensor local = a.to_local();
  add_(local, b.to_local());
  // a is now the sum: its node takes a's former producer and b as its inputs.
  const DTensor inputs[] = {a, b};
  DTensor y = a;
  record("add", inputs, std::span(&y, 1), [](const std::vector<DTensor>& g) {
    return std::vector<DTensor>{g[0], g[0]};
  });
  return y;
}

DTensor sub(const DTensor& a, const DTensor& b) {
  return binary(
      "sub", a, b, BinaryPartials::kBoth, {}, [](const Tensor& x, const Tensor& y) { return sub(x, y); },
      [](const DTensor& g, const BinarySaved& s) {
        return std::vector<DTensor>{sum_to_shape(g, s.a_shape), neg(sum_to_shape(g, s.b_shape))};
      });
}

DTensor mul(const DTensor& a, const DTensor& b) {
  return binary(
      "mul", a, b, BinaryPartials::kEither, {.a = true, .b = true},
      [](const Tensor& x, const Tensor& y) { return mul(x, y); },
      [](const DTensor& g, const BinarySaved& s) {
        // d(x*y)/dx = y, d(x*y)/dy = x; each summed over what it was broadcast along.
        return std::vector<DTensor>{sum_to_shape(mul(g, s.b), s.a_shape), sum_to_shape(mul(g, s.a), s.b_shape)};
      });
}

DTensor div(const DTensor& a, const DTensor& b) {
  return binary(
      "div", a, b, BinaryPartials::kLeft, {.b = true, .out = true},
      [](const Tensor& x, const Tensor& y) { return div(x, y); },
      [](const DTensor& g, const BinarySaved& s) {
        // d(x/y)/dx = 1/y; d(x/y)/dy = -x/y^2 = -out/y.
        return std::vector<DTensor>{sum_to_shape(div(g, s.b), s.a_shape),
                                    neg(sum_to_shape(div(mul(g, s.out), s.b), s.b_shape))};
      });
}

DTensor add(const DTensor& a, double b) {
  constexpr ReduceOp kAvgOnly[] = {ReduceOp::kAvg};
  return unary(
      "add", a, kAvgOnly, Saves::kNothing, [b](const Tensor& x) { return add(x, b); },
      [](const DTensor& g, const DTensor&) { return g; });
}

DTensor mul(const DTensor& a, double b) {
  return unary(
      "mul", a, kLinearReduceOps, Saves::kNothing, [b](const Tensor& x) { return mul(x, b); },
      [b](const DTensor& g, const DTensor&) { return mul(g, b); });
}

DTensor div(const DTensor& a, double b) {
  return unary(
      "div", a, kLinearReduceOps, Saves::kNothing, [b](const Tensor& x) { return div(x, b); },
      [b](const DTensor& g, const DTensor&) { return div(g, b); });
}

DTensor neg(const DTensor& a) { return mul(a, -1.0); }

DTensor exp(const DTensor& x) {
  return unary(
      "exp", x, {}, Saves::kOutput, [](const Tensor& t) { return exp(t); },
      [](const DTensor& g, const DTensor& y) { return mul(g, y); });
}

DTensor log(const DTensor& x) {
  return unary(
      "log", x, {}, Saves::kInput, [](const Tensor& t) { return log(t); },
      [](const DTensor& g, const DTensor& in) { return div(g, in); });
}

DTensor sqrt(const DTensor& x) {
  return unary(
      "sqrt", x, {}, Saves::kOutput, [](const Tensor& t) { return sqrt(t); },
      [](const DTensor& g, const DTensor& y) { return div(mul(g, 0.5), y); });  // 1 / (2 sqrt(x))
}

DTensor rsqrt(const DTensor& x) {
  return unary(
      "rsqrt", x, {}, Saves::kOutput, [](const Tensor& t) { return rsqrt(t); },
      [](const DTensor& g, const DTensor& y) { return mul(g, mul(pow(y, 3.0), -0.5)); });  // -x^(-3/2) / 2
}

DTensor pow(const DTensor& x, double exponent) {
  return unary(
      "pow", x, {}, Saves::kInput, [exponent](const Tensor& t) { return pow(t, exponent); },
      [exponent](const DTensor& g, const DTensor& in) {
        // p x^(p-1); x^0 is constant (torch's pow_backward), even where x^(-1) is infinite.
        return exponent == 0.0 ? mul(g, 0.0) : mul(g, mul(pow(in, exponent - 1.0), exponent));
      });
}

DTensor tanh(const DTensor& x) {
  return unary(
      "tanh", x, {}, Saves::kOutput, [](const Tensor& t) { return tanh(t); },
      [](const DTensor& g, const DTensor& y) { return tanh_backward(g, y); });
}

DTensor sigmoid(const DTensor& x) {
  return unary(
      "sigmoid", x, {}, Saves::kOutput, [](const Tensor& t) { return sigmoid(t); },
      [](const DTensor& g, const DTensor& y) { return sigmoid_backward(g, y); });
}

namespace {

// relu's backward from the bits relu_mask kept of its output y (placed as `placements`).
BackwardFn relu_backward_fn(Tensor mask, Placements placements) {
  return [mask = std::move(mask), placements = std::move(placements)](std::vector<DTensor> g) {
    // The mask is laid out as the output's local part: a gradient placed otherwise on a mesh
    // dim is moved to the output's placement there first (a Partial one stays where the
    // output is Replicate: it masks term by term).
    DTensor grad = std::move(g[0]);
    Placements aligned = grad.placements();
    for (size_t m = 0; m < placements.size(); ++m) {
      if (aligned[m] != placements[m] && !(aligned[m].is_partial() && placements[m].is_replicate())) {
        aligned[m] = placements[m];
      }
    }
    if (aligned != grad.placements()) grad = grad.redistribute(aligned);
    const bool in_place = grad.is_sole_owner() && grad.to_local().is_contiguous();
    Tensor local = in_place ? grad.to_local() : grad.to_local().clone();
    apply_relu_mask_(local, mask);
    return std::vector<DTensor>{in_place ? grad : DTensor(std::move(local), grad.spec())};
  };
}

}  // namespace

// Saves a bit per element, where its output is not <= 0 (kernels/relu_mask.h): torch's
// threshold_backward(grad, output, 0) passes the gradient there, so the gradient is the
// same. Neither the input (a linear layer's result, which the next layer does not read) nor
// the output is kept: the next layer, a linear, holds the output and lets go of it once its
// backward has read it (dtensor/ops/matmul.cc), before it allocates the gradient it hands
// back here, so the feed-forward's backward never holds the hidden activation beside its
// gradient. The backward zeroes the gradient in place where nothing else holds it and it is
// a plain buffer (the engine's gradient, contiguous: not a broadcast view), in a copy
// otherwise.
DTensor relu(const DTensor& x) {
  DTensor moved;
  DTensor y = unary_forward(
      "relu", x, {}, [](const Tensor& t) { return relu(t); }, moved);
  if (needs_grad(std::span(&moved, 1))) {
    record("relu", std::span(&moved, 1), std::span(&y, 1), relu_backward_fn(relu_mask(y.to_local()), y.placements()));
  }
  return y;
}

DTensor relu_(const DTensor& x) {
  if (!overwritable(x)) return relu(x);
  Tensor local = x.to_local();
  relu_(local);
  // x is now relu's output: its node takes x's former producer as its input.
  DTensor y = x;
  if (needs_grad(std::span(&x, 1))) {
    record("relu", std::span(&x, 1), std::span(&y, 1), relu_backward_fn(relu_mask(local), y.placements()));
  }
  return y;
}

DTensor gelu(const DTensor& x, GeluApproximation approximate) {
  return unary(
      "gelu", x, {}, Saves::kInput, [approximate](const Tensor& t) { return gelu(t, approximate); },
      [approximate](const DTensor& g, const DTensor& in) { return gelu_backward(g, in, approximate); });
}

DTensor silu(const DTensor& x) {
  return unary(
      "silu", x, {}, Saves::kInput, [](const Tensor& t) { return silu(t); },
      [](const DTensor& g, const DTensor& in) { return silu_backward(g, in); });
}

DTensor relu_backward(const DTensor& grad, const DTensor& x) {
  return fused_backward("relu_backward", grad, x, [](const Tensor& g, const Tensor& t) { return relu_backward(g, t); });
}

DTensor gelu_backward(const DTensor& grad, const DTensor& x, GeluApproximation approximate) {
  return fused_backward("gelu_backward", grad, x,
                        [approximate](const Tensor& g, const Tensor& t) { return gelu_backward(g, t, approximate); });
}

DTensor silu_backward(const DTensor& grad, const DTensor& x) {
  return fused_backward("silu_backward", grad, x, [](const Tensor& g, const Tensor& t) { return silu_backward(g, t); });
}

DTensor sigmoid_backward(const DTensor& grad, const DTensor& y) {
  return fused_backward("sigmoid_backward", grad, y,
                        [](const Tensor& g, const Tensor& t) { return sigmoid_backward(g, t); });
}

DTensor tanh_backward(const DTensor& grad, const DTensor& y) {
  return fused_backward("tanh_backward", grad, y, [](const Tensor& g, const Tensor& t) { return tanh_backward(g, t); });
}

DTensor to(const DTensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  const DType from = x.dtype();
  const bool floating = is_floating(from) && is_floating(dtype);
  const DTensor inputs[] = {x};
  AppliedStrategy s =
      apply_strategy("to", inputs,
                     expand_strategies(elementwise_strategies({x.shape()}, x.shape(),
                                                              floating ? kAllReduceOps : std::span<const ReduceOp>{},
                                                              strided_split_factors(inputs)),
                                       x.mesh().ndim()));
  DTensor y = make_output(s.inputs[0].to_local().to(dtype), x.mesh(), s.strategy.outputs[0], x.shape());
  if (floating) {
    record("to", s.inputs, std::span(&y, 1),
           [from](const std::vector<DTensor>& g) { return std::vector<DTensor>{to(g[0], from)}; });
  }
  return y;
}

}  // namespace dtr
