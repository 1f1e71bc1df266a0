#include "dtensor/ops/softmax.h"

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "kernels/softmax.h"

namespace dtr {
namespace {

// The local kernels of one normalisation (softmax or log_softmax).
struct NormaliseKernels {
  std::string_view op;
  Tensor (*forward)(const Tensor& x, int64_t dim);
  Tensor (*backward)(const Tensor& grad_y, const Tensor& y, int64_t dim);
};

// grad_x from grad_y and the forward's output y (rules: docs/sharding_rules.md, "softmax").
// Not differentiable.
DTensor normalise_backward(const NormaliseKernels& k, const DTensor& grad_y, const DTensor& y, int64_t dim) {
  std::vector<DimStrategy> per_dim;
  for (int64_t d = 0; d < y.dim(); ++d) {
    if (d != dim) per_dim.push_back({{Shard(d), Shard(d)}, {Shard(d)}});
  }
  per_dim.push_back(replicate_all(2));
  add_linear_partials(per_dim, 2, 0);
  const DTensor inputs[] = {grad_y, y};
  AppliedStrategy s =
      apply_strategy(fmt::format("{} backward", k.op), inputs, expand_strategies(per_dim, y.mesh().ndim()));
  return make_output(k.backward(s.inputs[0].to_local(), s.inputs[1].to_local(), dim), y.mesh(), s.strategy.outputs[0],
                     y.shape());
}

DTensor normalise(const NormaliseKernels& k, const DTensor& x, int64_t dim) {
  DTR_CHECK(is_floating(x.dtype()), TypeError,
            "{}: input {} is not floating; it takes float32, float64, bfloat16 or float16", k.op, describe(x));
  dim = wrap_dim(dim, x.dim(), k.op);
  std::vector<DimStrategy> per_dim;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d != dim) per_dim.push_back({{Shard(d)}, {Shard(d)}});
  }
  per_dim.push_back(replicate_all(1));
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy(k.op, inputs, expand_strategies(per_dim, x.mesh().ndim()));
  DTensor y = make_output(k.forward(s.inputs[0].to_local(), dim), x.mesh(), s.strategy.outputs[0], x.shape());
  record(std::string(k.op), s.inputs, std::span(&y, 1), [k, yd = y.detach(), dim](const std::vector<DTensor>& g) {
    return std::vector<DTensor>{normalise_backward(k, g[0], yd, dim)};
  });
  return y;
}

}  // namespace

DTensor softmax(const DTensor& x, int64_t dim) { return normalise({"softmax", softmax, softmax_backward}, x, dim); }

DTensor log_softmax(const DTensor& x, int64_t dim) {
  return normalise({"log_softmax", log_softmax, log_softmax_backward}, x, dim);
}

}  // namespace dtr
