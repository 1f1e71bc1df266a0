#include "dtensor/ops/rms_norm.h"

#include <array>
#include <cmath>

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "kernels/block_reduce.h"
#include "kernels/rms_norm.h"

namespace dtr {
namespace {

// The local backward; under --deterministic one call per sequence, the weight gradient
// summed in kernels/block_reduce.h's tree.
RMSNormGrads local_backward(const Tensor& grad_y, const Tensor& x, const Tensor& rstd,
                            const std::optional<Tensor>& weight) {
  const int64_t block = block_rows(x.shape(), rstd.dim(), "rms_norm backward");
  if (block == 0) return rms_norm_backward(grad_y, x, rstd, weight);
  const int64_t lead = rstd.dim(), rows = rstd.numel();
  const Tensor gy = grad_y.flatten(0, lead - 1), xs = x.flatten(0, lead - 1), rstds = rstd.flatten();
  RMSNormGrads g{.grad_x = Tensor::empty(xs.shape(), x.dtype(), x.device())};
  std::vector<Tensor> params = reduce_rows(rows, block, [&](int64_t first, int64_t n) {
    RMSNormGrads b =
        rms_norm_backward(gy.narrow(0, first, n), xs.narrow(0, first, n), rstds.narrow(0, first, n), weight);
    g.grad_x.narrow(0, first, n).copy_(b.grad_x);
    return std::vector{std::move(b.grad_weight)};
  });
  g.grad_x = g.grad_x.view(x.shape());
  g.grad_weight = std::move(params[0]);
  return g;
}

// {grad_x, grad_weight} from the saved x, rstd and weight (rules: docs/sharding_rules.md,
// "rms_norm"). Not differentiable.
std::array<DTensor, 2> rms_norm_backward(const DTensor& grad_y, const DTensor& x, const DTensor& rstd,
                                         const std::optional<DTensor>& weight) {
  std::vector<DTensor> inputs{grad_y, x, rstd};
  if (weight) inputs.push_back(*weight);
  const size_t n = inputs.size();
  std::vector<DimStrategy> per_dim;
  for (int64_t d = 0; d < rstd.dim(); ++d) {
    std::vector<Placement> in(3, Shard(d));
    in.resize(n, Replicate());
    per_dim.push_back({in, {Shard(d), Partial()}});
  }
  per_dim.push_back(replicate_all(n, 2));
  add_linear_partials(per_dim, n, 0, 2);
  AppliedStrategy s = apply_strategy("rms_norm backward", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  std::optional<Tensor> w;
  if (weight) w = s.inputs[3].to_local();
  RMSNormGrads g = local_backward(s.inputs[0].to_local(), s.inputs[1].to_local(), s.inputs[2].to_local(), w);
  const Shape normalized(x.shape().begin() + rstd.dim(), x.shape().end());
  const std::vector<Placements>& out = s.strategy.outputs;
  return {make_output(std::move(g.grad_x), x.mesh(), out[0], x.shape()),
          make_output(std::move(g.grad_weight), x.mesh(), out[1], normalized)};
}

}  // namespace

DTensor rms_norm(const DTensor& x, const Shape& normalized_shape, const std::optional<DTensor>& weight,
                 std::optional<double> eps) {
  const int64_t lead = x.dim() - static_cast<int64_t>(normalized_shape.size());
  DTR_CHECK(is_floating(x.dtype()), TypeError,
            "rms_norm: input {} is not floating; it takes float32, float64, bfloat16 or float16", describe(x));
  const bool fits =
      !normalized_shape.empty() && lead >= 0 && Shape(x.shape().begin() + lead, x.shape().end()) == normalized_shape;
  DTR_CHECK(fits, ValueError,
            "rms_norm: input {} does not end in normalized_shape {}; legal: a non-empty shape that the input's "
            "last dims equal",
            describe(x), normalized_shape);
  DTR_CHECK(!weight || (weight->shape() == normalized_shape && weight->dtype() == x.dtype()), ValueError,
            "rms_norm: weight {} for input {}: it must have normalized_shape {} and the input's dtype",
            describe(*weight), describe(x), normalized_shape);
  DTR_CHECK(!eps || (*eps >= 0.0 && std::isfinite(*eps)), ValueError,
            "rms_norm: eps {} for input {} must be finite and >= 0", eps.value_or(0.0), describe(x));
  std::vector<DTensor> inputs{x};
  if (weight) inputs.push_back(*weight);
  std::vector<DimStrategy> per_dim;
  for (int64_t d = 0; d < lead; ++d) {
    std::vector<Placement> in(inputs.size(), Replicate());
    in[0] = Shard(d);
    per_dim.push_back({in, {Shard(d)}});
  }
  per_dim.push_back(replicate_all(inputs.size()));
  AppliedStrategy s = apply_strategy("rms_norm", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  std::optional<Tensor> w;
  if (weight) w = s.inputs[1].to_local();
  RMSNormOutput out = rms_norm(s.inputs[0].to_local(), normalized_shape, w, eps);
  const Placements& p = s.strategy.outputs[0];
  DTensor y = make_output(std::move(out.y), x.mesh(), p, x.shape());
  // rstd [rows]: the row dims keep x's placements.
  DTensor rstd = make_output(std::move(out.rstd), x.mesh(), p, Shape(x.shape().begin(), x.shape().begin() + lead));
  std::optional<DTensor> saved_weight;
  if (weight) saved_weight = s.inputs[1].detach();
  record("rms_norm", s.inputs, std::span(&y, 1),
         [xd = s.inputs[0].detach(), rstd, saved_weight](const std::vector<DTensor>& g) {
           std::array<DTensor, 2> grads = rms_norm_backward(g[0], xd, rstd, saved_weight);
           std::vector<DTensor> out{grads[0]};
           if (saved_weight) out.push_back(grads[1]);
           return out;
         });
  return y;
}

}  // namespace dtr
