#include "dtensor/ops/layer_norm.h"

#include <array>

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "kernels/block_reduce.h"
#include "kernels/layer_norm.h"

namespace dtr {
namespace {

// The local backward; under --deterministic one call per sequence, the weight and bias
// gradients summed in kernels/block_reduce.h's tree.
LayerNormGrads local_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const std::optional<Tensor>& weight) {
  const int64_t block = block_rows(x.shape(), mean.dim(), "layer_norm backward");
  if (block == 0) return layer_norm_backward(grad_y, x, mean, rstd, weight);
  const int64_t lead = mean.dim(), rows = mean.numel();
  const Tensor gy = grad_y.flatten(0, lead - 1), xs = x.flatten(0, lead - 1), means = mean.flatten(),
               rstds = rstd.flatten();
  LayerNormGrads g{.grad_x = Tensor::empty(xs.shape(), x.dtype(), x.device())};
  std::vector<Tensor> params = reduce_rows(rows, block, [&](int64_t first, int64_t n) {
    LayerNormGrads b = layer_norm_backward(gy.narrow(0, first, n), xs.narrow(0, first, n), means.narrow(0, first, n),
                                           rstds.narrow(0, first, n), weight);
    g.grad_x.narrow(0, first, n).copy_(b.grad_x);
    return std::vector{std::move(b.grad_weight), std::move(b.grad_bias)};
  });
  g.grad_x = g.grad_x.view(x.shape());
  g.grad_weight = std::move(params[0]);
  g.grad_bias = std::move(params[1]);
  return g;
}

// {grad_x, grad_weight, grad_bias} from the saved x, mean, rstd and weight (rules:
// docs/sharding_rules.md, "layer_norm"). Not differentiable.
std::array<DTensor, 3> layer_norm_backward(const DTensor& grad_y, const DTensor& x, const DTensor& mean,
                                           const DTensor& rstd, const std::optional<DTensor>& weight) {
  std::vector<DTensor> inputs{grad_y, x, mean, rstd};
  if (weight) inputs.push_back(*weight);
  const size_t n = inputs.size();
  std::vector<DimStrategy> per_dim;
  for (int64_t d = 0; d < mean.dim(); ++d) {
    std::vector<Placement> in(4, Shard(d));
    in.resize(n, Replicate());
    per_dim.push_back({in, {Shard(d), Partial(), Partial()}});
  }
  per_dim.push_back(replicate_all(n, 3));
  add_linear_partials(per_dim, n, 0, 3);
  AppliedStrategy s = apply_strategy("layer_norm backward", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  std::optional<Tensor> w;
  if (weight) w = s.inputs[4].to_local();
  const LayerNormGrads g =
      local_backward(s.inputs[0].to_local(), s.inputs[1].to_local(), s.inputs[2].to_local(), s.inputs[3].to_local(), w);
  const Shape normalized(x.shape().begin() + mean.dim(), x.shape().end());
  const std::vector<Placements>& out = s.strategy.outputs;
  return {make_output(std::move(g.grad_x), x.mesh(), out[0], x.shape()),
          make_output(std::move(g.grad_weight), x.mesh(), out[1], normalized),
          make_output(std::move(g.grad_bias), x.mesh(), out[2], normalized)};
}

}  // namespace

DTensor layer_norm(const DTensor& x, const Shape& normalized_shape, const std::optional<DTensor>& weight,
                   const std::optional<DTensor>& bias, double eps) {
  const int64_t lead = x.dim() - static_cast<int64_t>(normalized_shape.size());
  DTR_CHECK(is_floating(x.dtype()), TypeError,
            "layer_norm: input {} is not floating; it takes float32, float64, bfloat16 or float16", describe(x));
  const bool fits =
      !normalized_shape.empty() && lead >= 0 && Shape(x.shape().begin() + lead, x.shape().end()) == normalized_shape;
  DTR_CHECK(fits, ValueError,
            "layer_norm: input {} does not end in normalized_shape {}; legal: a non-empty shape that the input's "
            "last dims equal",
            describe(x), normalized_shape);
  for (const auto* t : {&weight, &bias}) {
    DTR_CHECK(!*t || ((*t)->shape() == normalized_shape && (*t)->dtype() == x.dtype()), ValueError,
              "layer_norm: {} {} for input {}: it must have normalized_shape {} and the input's dtype",
              t == &weight ? "weight" : "bias", describe(**t), describe(x), normalized_shape);
  }
  std::vector<DTensor> inputs{x};
  if (weight) inputs.push_back(*weight);
  if (bias) inputs.push_back(*bias);
  std::vector<DimStrategy> per_dim;
  for (int64_t d = 0; d < lead; ++d) {
    std::vector<Placement> in(inputs.size(), Replicate());
    in[0] = Shard(d);
    per_dim.push_back({in, {Shard(d)}});
  }
  per_dim.push_back(replicate_all(inputs.size()));
  AppliedStrategy s = apply_strategy("layer_norm", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  std::optional<Tensor> w, b;
  if (weight) w = s.inputs[1].to_local();
  if (bias) b = s.inputs.back().to_local();
  LayerNormOutput out = layer_norm(s.inputs[0].to_local(), normalized_shape, w, b, eps);
  const Placements& p = s.strategy.outputs[0];
  const Shape rows(x.shape().begin(), x.shape().begin() + lead);
  DTensor y = make_output(std::move(out.y), x.mesh(), p, x.shape());
  // mean and rstd [rows]: the row dims keep x's placements.
  DTensor mean = make_output(std::move(out.mean), x.mesh(), p, rows);
  DTensor rstd = make_output(std::move(out.rstd), x.mesh(), p, rows);
  std::optional<DTensor> saved_weight;
  if (weight) saved_weight = s.inputs[1].detach();
  record("layer_norm", s.inputs, std::span(&y, 1),
         [xd = s.inputs[0].detach(), mean, rstd, saved_weight,
          has_bias = bias.has_value()](const std::vector<DTensor>& g) {
           std::array<DTensor, 3> grads = layer_norm_backward(g[0], xd, mean, rstd, saved_weight);
           std::vector<DTensor> out{grads[0]};
           if (saved_weight) out.push_back(grads[1]);
           if (has_bias) out.push_back(grads[2]);
           return out;
         });
  return y;
}

}  // namespace dtr
