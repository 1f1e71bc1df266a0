#include "dtensor/ops/matmul.h"

#include <utility>

#include "dtensor/autograd.h"
#include "dtensor/kept_outputs.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"

namespace dtr {
namespace {

// P(op), R -> P(op) and R, P(op) -> P(op): a product is linear in each operand.
void add_product_partials(std::vector<DimStrategy>& per_dim) {
  add_linear_partials(per_dim, 2, 0);
  add_linear_partials(per_dim, 2, 1);
}

// The number of elements in t's dims before its last `trailing` ones.
int64_t leading_numel(const Tensor& t, size_t trailing) {
  return shape_numel(std::span(t.shape()).first(t.shape().size() - trailing));
}

void check_floating_pair(std::string_view op, const DTensor& a, const DTensor& b) {
  DTR_CHECK(a.dtype() == b.dtype() && is_floating(a.dtype()), TypeError,
            "{}: operands {} and {} must share one floating dtype (float32, float64, bfloat16 or float16); "
            "convert one with .to()",
            op, describe(a), describe(b));
}

// The local product of matmul's two cases (see matmul.h); locals may be views.
Tensor local_matmul(const Tensor& a, const Tensor& b) {
  Shape out = a.shape();
  out.back() = b.size(-1);
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  if (b.dim() == 2) {
    if (a.dim() == 2) return matmul(a, b);
    return matmul(a.reshape({leading_numel(a, 1), k}), b).view(out);
  }
  const int64_t batch = leading_numel(a, 2);
  return bmm(a.reshape({batch, m, k}), b.reshape({batch, k, n})).view(out);
}

// The local product a [*, K] b [K, N] (b 2-D; locals may be views), plus `bias` [N] where
// defined: one product (matmul_bias with a bias), or under --deterministic's feature blocks
// (kernels/block_reduce.h) a product per block of the global contraction's `k_global / blocks`
// features, of which the locals hold whole ones, summed in the canonical tree, the bias added
// to the root (as a Partial product's separate add, after its reduction, rounds it).
Tensor local_product(std::string_view op, const Tensor& a, const Tensor& b, const Tensor& bias, int64_t k_global) {
  const int64_t blocks = deterministic_feature_blocks();
  if (blocks == 1 || k_global == 0) return bias.defined() ? matmul_bias(a, b, bias) : local_matmul(a, b);
  const int64_t k = a.size(-1);
  DTR_CHECK(k_global % blocks == 0 && k > 0 && k % (k_global / blocks) == 0, ValueError,
            "{}: --deterministic sums a contraction of {} features in {} blocks (--feature-blocks), but {} and this "
            "rank's {} of them do not split into whole blocks; use a block count dividing the model's widths that the "
            "tensor-parallel size divides",
            op, k_global, blocks, k_global, k);
  const int64_t width = k_global / blocks;
  Tensor root = tree_sum(k / width, [&](int64_t i) {
    return std::vector{local_matmul(a.narrow(-1, i * width, width), b.narrow(0, i * width, width))};
  })[0];
  return bias.defined() ? add(root, bias) : root;
}

// a [*, K]^T g [*, N] summed over every leading index -> [K, N]: the weight gradient of a
// product with a 2-D right operand (rules: docs/sharding_rules.md, "matmul"); under
// --deterministic a product per sequence, summed in kernels/block_reduce.h's tree. Not
// differentiable (backward only).
DTensor contract_leading_dims(const DTensor& a, const DTensor& g) {
  const int64_t nd = a.dim();
  std::vector<DimStrategy> per_dim;
  for (int64_t i = 0; i + 1 < nd; ++i) per_dim.push_back({{Shard(i), Shard(i)}, {Partial()}});
  per_dim.push_back({{Shard(nd - 1), Replicate()}, {Shard(0)}});
  per_dim.push_back({{Replicate(), Shard(nd - 1)}, {Shard(1)}});
  per_dim.push_back(replicate_all(2));
  add_product_partials(per_dim);
  const DTensor inputs[] = {a, g};
  AppliedStrategy s = apply_strategy("matmul backward (weight)", inputs, expand_strategies(per_dim, a.mesh().ndim()));
  const Tensor& al = s.inputs[0].to_local();
  const Tensor& gl = s.inputs[1].to_local();
  const int64_t rows = leading_numel(al, 1);
  const Tensor a_rows = al.reshape({rows, al.size(-1)});
  const Tensor g_rows = gl.reshape({rows, gl.size(-1)});
  Tensor local = reduce_rows(rows, block_rows(al.shape(), al.dim() - 1, "matmul backward (weight)"),
                             [&](int64_t first, int64_t n) {
                               return std::vector{matmul(a_rows.narrow(0, first, n).t(), g_rows.narrow(0, first, n))};
                             })[0];
  return make_output(std::move(local), a.mesh(), s.strategy.outputs[0], {a.size(-1), g.size(-1)});
}

// A product's input gradients from g, grad_b first: grad_b [*, K, N] = a^T [*, K, M] @ g
// [*, M, N] (for a 2-D b, summed over *: [K, N]); then, where this backward runs once, a is
// let go before grad_a [*, M, K] = g @ b^T [(*,) N, K] is allocated (a feed-forward's hidden
// activation, [tokens, 4 dim], which relu keeps only as a mask, is then never held beside
// its gradient). Returns {grad_a, grad_b}, undefined where not needed.
std::pair<DTensor, DTensor> product_grads(DTensor& a, const DTensor& b, const DTensor& g, bool batched, bool need_a,
                                          bool need_b) {
  std::pair<DTensor, DTensor> grads;
  if (need_b) grads.second = batched ? matmul(transpose(a, -2, -1), g) : contract_leading_dims(a, g);
  if (backward_runs_once()) a = DTensor();
  if (need_a) grads.first = matmul(g, transpose(b, -2, -1));
  return grads;
}

// Whether linear may add a bias of placements `bias` in the product's epilogue (a local
// matmul_bias) to an output of placements `out` ([*, N], nd dims): exactly when add(out,
// bias) would take these placements as they are, with no Partial among them. Per mesh dim:
// out R or S(d) for d < nd - 1 with bias R, or out S(nd - 1) with bias S(0) (N split alike,
// so each rank holds the bias of its columns). A Partial output keeps the separate add (the
// bias once, not once per rank, however add places it).
bool fuses_bias(const Placements& out, const Placements& bias, int64_t nd) {
  for (size_t m = 0; m < out.size(); ++m) {
    if (out[m].is_partial()) return false;
    const bool columns = out[m].is_shard(nd - 1);
    if (columns ? !bias[m].is_shard(0) : !bias[m].is_replicate()) return false;
  }
  return true;
}

// y = a b + bias with the bias in the local product's epilogue: s holds a [*, M, K] and a 2-D
// b as the product's strategy placed them, the bias as fuses_bias accepts it. Its backward
// is what matmul's and add's give: the bias gradient first (add's node runs before the
// product's), then the product's from the same g, as matmul's (below).
DTensor linear_fused(std::string_view op, const AppliedStrategy& s, const DTensor& bias, const Shape& out_shape) {
  const DTensor& a = s.inputs[0];
  const DTensor& b = s.inputs[1];
  Tensor local = kept_or_computed(
      op, [&] { return std::vector{local_product(op, a.to_local(), b.to_local(), bias.to_local(), a.size(-1))}; },
      a.to_local().size(-1))[0];
  DTensor y = make_output(std::move(local), a.mesh(), s.strategy.outputs[0], out_shape);
  const DTensor inputs[] = {a, b, bias};
  record(std::string(op), inputs, std::span(&y, 1),
         [xa = a.detach(), xb = b.detach(), bias_shape = bias.shape(), need_a = a.requires_grad(),
          need_b = b.requires_grad(), need_bias = bias.requires_grad()](const std::vector<DTensor>& g) mutable {
           // grad_bias [N] = g [*, M, N] summed over every leading dim (add's backward)
           DTensor grad_bias = need_bias ? sum_to_shape(g[0], bias_shape) : DTensor();
           auto [grad_a, grad_b] = product_grads(xa, xb, g[0], /*batched=*/false, need_a, need_b);
           return std::vector<DTensor>{std::move(grad_a), std::move(grad_b), std::move(grad_bias)};
         });
  return y;
}

// matmul and bmm after their shape checks; `op` names the errors of the strategy choice.
// With a bias (linear's; b is 2-D), the product adds it in its epilogue where fuses_bias
// allows, and through add otherwise: either way the same values, placements, collectives
// and gradients.
DTensor matmul_checked(std::string_view op, const DTensor& a, const DTensor& b, const DTensor* bias = nullptr) {
  const int64_t nd = a.dim();
  const bool batched = b.dim() > 2;
  Shape out_shape = a.shape();
  out_shape.back() = b.size(-1);
  std::vector<DimStrategy> per_dim;
  for (int64_t i = 0; i + 2 < nd; ++i) {
    per_dim.push_back({{Shard(i), batched ? Shard(i) : Replicate()}, {Shard(i)}});
  }
  per_dim.push_back({{Shard(nd - 2), Replicate()}, {Shard(nd - 2)}});
  per_dim.push_back({{Replicate(), Shard(b.dim() - 1)}, {Shard(nd - 1)}});
  per_dim.push_back({{Shard(nd - 1), Shard(b.dim() - 2)}, {Partial()}});
  per_dim.push_back(replicate_all(2));
  add_product_partials(per_dim);
  const DTensor inputs[] = {a, b};
  AppliedStrategy s = apply_strategy(op, inputs, expand_strategies(per_dim, a.mesh().ndim()));
  if (bias != nullptr && bias->mesh() == a.mesh() && fuses_bias(s.strategy.outputs[0], bias->placements(), nd)) {
    return linear_fused(op, s, *bias, out_shape);
  }
  Tensor local = kept_or_computed(
      op,
      [&] {
        const Tensor& al = s.inputs[0].to_local();
        const Tensor& bl = s.inputs[1].to_local();
        return std::vector{batched ? local_matmul(al, bl) : local_product(op, al, bl, Tensor(), a.size(-1))};
      },
      s.inputs[0].to_local().size(-1))[0];
  DTensor y = make_output(std::move(local), a.mesh(), s.strategy.outputs[0], out_shape);
  record(std::string(op), s.inputs, std::span(&y, 1),
         [xa = s.inputs[0].detach(), xb = s.inputs[1].detach(), need_a = s.inputs[0].requires_grad(),
          need_b = s.inputs[1].requires_grad(), batched](const std::vector<DTensor>& g) mutable {
           auto [grad_a, grad_b] = product_grads(xa, xb, g[0], batched, need_a, need_b);
           return std::vector<DTensor>{std::move(grad_a), std::move(grad_b)};
         });
  if (bias == nullptr) return y;
  if (deterministic_feature_blocks() > 1 && y.spec().has_partial()) {
    // The bias goes on after the reduction, as one rank's product adds it to the tree's root;
    // add would place it on one rank's term (Replicate to Partial is free) and round it there.
    y = y.redistribute(reduced_placements(y.placements()));
  }
  return add(y, *bias);
}

}  // namespace

DTensor matmul(const DTensor& a, const DTensor& b) {
  check_floating_pair("matmul", a, b);
  auto leading = [](const DTensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); };
  const bool ranks = a.dim() >= 2 && (b.dim() == 2 || (b.dim() == a.dim() && leading(a) == leading(b)));
  DTR_CHECK(ranks && a.size(-1) == b.size(-2), ValueError,
            "matmul: {} @ {} do not chain; legal: a [*, M, K] with b [K, N], or with b [*, K, N] of the same "
            "leading dims *",
            describe(a), describe(b));
  return matmul_checked("matmul", a, b);
}

DTensor bmm(const DTensor& a, const DTensor& b) {
  check_floating_pair("bmm", a, b);
  DTR_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1), ValueError,
            "bmm: {} @ {} do not chain; legal: a [B, M, K] with b [B, K, N]", describe(a), describe(b));
  return matmul_checked("bmm", a, b);
}

DTensor linear(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias) {
  DTR_CHECK(x.dim() >= 2 && weight.dim() == 2 && x.size(-1) == weight.size(1) &&
                (!bias || (bias->dim() == 1 && bias->size(0) == weight.size(0))),
            ValueError,
            "linear: input {}, weight {} and bias {} do not fit; legal: input [*, in] (at least 2-D), "
            "weight [out, in], bias [out]",
            describe(x), describe(weight), bias ? describe(*bias) : "none");
  check_floating_pair("linear", x, weight);
  if (bias) check_floating_pair("linear", x, *bias);
  return matmul_checked("linear", x, transpose(weight, 0, 1), bias ? &*bias : nullptr);
}

}  // namespace dtr
