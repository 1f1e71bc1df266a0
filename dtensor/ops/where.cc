#include "dtensor/ops/where.h"

#include "dtensor/autograd.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/op_util.h"
#include "kernels/elementwise.h"

namespace dtr {
namespace {

// A condition or mask must be bool.
void check_bool(std::string_view op, std::string_view role, const DTensor& t) {
  DTR_CHECK(t.dtype() == kBool, TypeError,
            "{}: the {} must be a bool DTensor, got {}; build it with a comparison such as gt() or with to(t, kBool)",
            op, role, describe(t));
}

// The broadcast shape of the inputs, and the elementwise candidates for them.
std::vector<DimStrategy> elementwise_candidates(std::string_view op, std::span<const DTensor> inputs, Shape* out) {
  std::vector<Shape> shapes;
  for (const DTensor& t : inputs) {
    shapes.push_back(t.shape());
    *out = broadcast_shapes(*out, t.shape(), op);
  }
  return elementwise_strategies(shapes, *out);
}

// Runs an elementwise op whose output takes no gradient (comparisons, logical_not): Partial
// inputs are reduced first, outside autograd.
template <class Kernel>
DTensor without_grad(std::string_view op, std::span<const DTensor> inputs, Kernel kernel) {
  NoGradGuard no_grad;
  Shape out;
  const std::vector<DimStrategy> per_dim = elementwise_candidates(op, inputs, &out);
  AppliedStrategy s = apply_strategy(op, inputs, expand_strategies(per_dim, inputs[0].mesh().ndim()));
  std::vector<Tensor> locals;
  for (const DTensor& t : s.inputs) locals.push_back(t.to_local());
  return make_output(kernel(locals), inputs[0].mesh(), s.strategy.outputs[0], out);
}

template <class Kernel>
DTensor compare(std::string_view op, const DTensor& a, const DTensor& b, Kernel kernel) {
  const DTensor inputs[] = {a, b};
  return without_grad(op, inputs, [&](const std::vector<Tensor>& t) { return kernel(t[0], t[1]); });
}

template <class Kernel>
DTensor compare(std::string_view op, const DTensor& a, Kernel kernel) {
  const DTensor inputs[] = {a};
  return without_grad(op, inputs, [&](const std::vector<Tensor>& t) { return kernel(t[0]); });
}

}  // namespace

DTensor where(const DTensor& cond, const DTensor& a, const DTensor& b) {
  check_bool("where", "condition", cond);
  const DTensor inputs[] = {cond, a, b};
  Shape out;
  std::vector<DimStrategy> per_dim = elementwise_candidates("where", inputs, &out);
  for (ReduceOp op : kAllReduceOps) per_dim.push_back({{Replicate(), Partial(op), Partial(op)}, {Partial(op)}});
  AppliedStrategy s = apply_strategy("where", inputs, expand_strategies(per_dim, a.mesh().ndim()));
  DTensor y = make_output(where(s.inputs[0].to_local(), s.inputs[1].to_local(), s.inputs[2].to_local()), a.mesh(),
                          s.strategy.outputs[0], out);
  record("where", s.inputs, std::span(&y, 1),
         [c = s.inputs[0].detach(), a_shape = a.shape(), b_shape = b.shape()](const std::vector<DTensor>& g) {
           // [out] -> [a], [b]: g where the condition picked that operand, 0 elsewhere.
           return std::vector<DTensor>{DTensor(), sum_to_shape(masked_fill(g[0], logical_not(c), 0.0), a_shape),
                                       sum_to_shape(masked_fill(g[0], c, 0.0), b_shape)};
         });
  return y;
}

DTensor masked_fill(const DTensor& x, const DTensor& mask, double value) {
  check_bool("masked_fill", "mask", mask);
  const DTensor inputs[] = {x, mask};
  Shape out;
  std::vector<DimStrategy> per_dim = elementwise_candidates("masked_fill", inputs, &out);
  for (ReduceOp op : kAllReduceOps) {
    if (op != ReduceOp::kSum || value == 0.0) per_dim.push_back({{Partial(op), Replicate()}, {Partial(op)}});
  }
  AppliedStrategy s = apply_strategy("masked_fill", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  DTensor y = make_output(masked_fill(s.inputs[0].to_local(), s.inputs[1].to_local(), value), x.mesh(),
                          s.strategy.outputs[0], out);
  record("masked_fill", s.inputs, std::span(&y, 1),
         [m = s.inputs[1].detach(), x_shape = x.shape()](const std::vector<DTensor>& g) {
           // [out] -> [x]: g where x was kept, 0 where the value replaced it.
           return std::vector<DTensor>{sum_to_shape(masked_fill(g[0], m, 0.0), x_shape), DTensor()};
         });
  return y;
}

DTensor eq(const DTensor& a, const DTensor& b) {
  return compare("eq", a, b, [](const Tensor& x, const Tensor& y) { return eq(x, y); });
}
DTensor ne(const DTensor& a, const DTensor& b) {
  return compare("ne", a, b, [](const Tensor& x, const Tensor& y) { return ne(x, y); });
}
DTensor lt(const DTensor& a, const DTensor& b) {
  return compare("lt", a, b, [](const Tensor& x, const Tensor& y) { return lt(x, y); });
}
DTensor le(const DTensor& a, const DTensor& b) {
  return compare("le", a, b, [](const Tensor& x, const Tensor& y) { return le(x, y); });
}
DTensor gt(const DTensor& a, const DTensor& b) {
  return compare("gt", a, b, [](const Tensor& x, const Tensor& y) { return gt(x, y); });
}
DTensor ge(const DTensor& a, const DTensor& b) {
  return compare("ge", a, b, [](const Tensor& x, const Tensor& y) { return ge(x, y); });
}
DTensor eq(const DTensor& a, double b) {
  return compare("eq", a, [b](const Tensor& x) { return eq(x, b); });
}
DTensor ne(const DTensor& a, double b) {
  return compare("ne", a, [b](const Tensor& x) { return ne(x, b); });
}
DTensor lt(const DTensor& a, double b) {
  return compare("lt", a, [b](const Tensor& x) { return lt(x, b); });
}
DTensor le(const DTensor& a, double b) {
  return compare("le", a, [b](const Tensor& x) { return le(x, b); });
}
DTensor gt(const DTensor& a, double b) {
  return compare("gt", a, [b](const Tensor& x) { return gt(x, b); });
}
DTensor ge(const DTensor& a, double b) {
  return compare("ge", a, [b](const Tensor& x) { return ge(x, b); });
}

DTensor logical_not(const DTensor& x) {
  return compare("logical_not", x, [](const Tensor& t) { return logical_not(t); });
}

}  // namespace dtr
