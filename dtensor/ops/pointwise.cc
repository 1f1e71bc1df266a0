#include "dtensor/ops/pointwise.h"

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/reduction.h"
#include "kernels/elementwise.h"

namespace dtr {
namespace {

constexpr ReduceOp kLinearOps[] = {ReduceOp::kSum, ReduceOp::kAvg};

// Which Partial inputs a binary op accepts without reducing them.
enum class BinaryPartials : uint8_t {
  kBoth,   // add, sub: P(op), P(op) -> P(op)
  kLeft,   // div: P(op), R -> P(op)
  kEither  // mul: P(op), R -> P(op) and R, P(op) -> P(op)
};

AppliedStrategy choose_binary(std::string_view op, const DTensor& a, const DTensor& b, const Shape& out,
                              BinaryPartials partials) {
  std::vector<DimStrategy> per_dim =
      pointwise_strategies({a.shape(), b.shape()}, out, partials == BinaryPartials::kBoth ? kLinearOps : std::span<const ReduceOp>{});
  if (partials != BinaryPartials::kBoth) {
    for (ReduceOp r : kLinearOps) {
      per_dim.push_back({{Partial(r), Replicate()}, {Partial(r)}});
      if (partials == BinaryPartials::kEither) per_dim.push_back({{Replicate(), Partial(r)}, {Partial(r)}});
    }
  }
  const DTensor inputs[] = {a, b};
  return apply_strategy(op, inputs, expand_strategies(per_dim, a.mesh().ndim()));
}

// Runs a binary op: chooses placements, applies `kernel` to the locals, records `backward`
// (which receives the op's inputs as moved, detached, and its output, detached).
template <class Kernel, class Backward>
DTensor binary(std::string_view op, const DTensor& a, const DTensor& b, BinaryPartials partials, Kernel kernel,
               Backward backward) {
  const Shape out = broadcast_shapes(a.shape(), b.shape(), op);
  AppliedStrategy s = choose_binary(op, a, b, out, partials);
  DTensor y = make_output(kernel(s.inputs[0].to_local(), s.inputs[1].to_local()), a.mesh(), s.strategy.outputs[0], out);
  record(std::string(op), s.inputs, std::span(&y, 1),
         [x0 = s.inputs[0].detach(), x1 = s.inputs[1].detach(), yd = y.detach(), backward](const std::vector<DTensor>& g) {
           return backward(g[0], x0, x1, yd);
         });
  return y;
}

// Runs an op of one tensor and a scalar; `partials` lists the Partial ops it keeps.
template <class Kernel, class Backward>
DTensor unary_scalar(std::string_view op, const DTensor& a, std::span<const ReduceOp> partials, Kernel kernel,
                     Backward backward) {
  const DTensor inputs[] = {a};
  AppliedStrategy s =
      apply_strategy(op, inputs, expand_strategies(pointwise_strategies({a.shape()}, a.shape(), partials), a.mesh().ndim()));
  DTensor y = make_output(kernel(s.inputs[0].to_local()), a.mesh(), s.strategy.outputs[0], a.shape());
  record(std::string(op), s.inputs, std::span(&y, 1),
         [backward](const std::vector<DTensor>& g) { return std::vector<DTensor>{backward(g[0])}; });
  return y;
}

}  // namespace

DTensor sum_to_shape(const DTensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  DTensor r = g;
  if (lead > 0) {
    std::vector<int64_t> dims(lead);
    for (int64_t d = 0; d < lead; ++d) dims[d] = d;
    r = sum(r, dims, KeepDim::kNo);
  }
  std::vector<int64_t> ones;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (shape[d] == 1 && r.shape()[d] != 1) ones.push_back(d);
  }
  return ones.empty() ? r : sum(r, ones, KeepDim::kYes);
}

DTensor add(const DTensor& a, const DTensor& b) {
  return binary("add", a, b, BinaryPartials::kBoth, [](const Tensor& x, const Tensor& y) { return add(x, y); },
                [](const DTensor& g, const DTensor& x, const DTensor& y, const DTensor&) {
                  return std::vector<DTensor>{sum_to_shape(g, x.shape()), sum_to_shape(g, y.shape())};
                });
}

DTensor sub(const DTensor& a, const DTensor& b) {
  return binary("sub", a, b, BinaryPartials::kBoth, [](const Tensor& x, const Tensor& y) { return sub(x, y); },
                [](const DTensor& g, const DTensor& x, const DTensor& y, const DTensor&) {
                  return std::vector<DTensor>{sum_to_shape(g, x.shape()), neg(sum_to_shape(g, y.shape()))};
                });
}

DTensor mul(const DTensor& a, const DTensor& b) {
  return binary("mul", a, b, BinaryPartials::kEither, [](const Tensor& x, const Tensor& y) { return mul(x, y); },
                [](const DTensor& g, const DTensor& x, const DTensor& y, const DTensor&) {
                  // d(x*y)/dx = y, d(x*y)/dy = x; each summed over what it was broadcast along.
                  return std::vector<DTensor>{sum_to_shape(mul(g, y), x.shape()), sum_to_shape(mul(g, x), y.shape())};
                });
}

DTensor div(const DTensor& a, const DTensor& b) {
  return binary("div", a, b, BinaryPartials::kLeft, [](const Tensor& x, const Tensor& y) { return div(x, y); },
                [](const DTensor& g, const DTensor& x, const DTensor& y, const DTensor& out) {
                  // d(x/y)/dx = 1/y; d(x/y)/dy = -x/y^2 = -out/y.
                  return std::vector<DTensor>{sum_to_shape(div(g, y), x.shape()),
                                              neg(sum_to_shape(div(mul(g, out), y), y.shape()))};
                });
}

DTensor add(const DTensor& a, double b) {
  constexpr ReduceOp kAvgOnly[] = {ReduceOp::kAvg};
  return unary_scalar("add", a, kAvgOnly, [b](const Tensor& x) { return add(x, b); },
                      [](const DTensor& g) { return g; });
}

DTensor mul(const DTensor& a, double b) {
  return unary_scalar("mul", a, kLinearOps, [b](const Tensor& x) { return mul(x, b); },
                      [b](const DTensor& g) { return mul(g, b); });
}

DTensor neg(const DTensor& a) { return mul(a, -1.0); }

}  // namespace dtr
