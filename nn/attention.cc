#include "nn/attention.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "dtensor/ops/attention.h"
#include "dtensor/ops/dropout.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/matmul.h"
#include "dtensor/ops/reduce.h"
#include "dtensor/ops/shape_ops.h"
#include "dtensor/ops/softmax.h"
#include "dtensor/ops/view_ops.h"
#include "dtensor/ops/where.h"
#include "kernels/block_reduce.h"
#include "nn/init.h"

namespace dtr::nn {

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, const MultiheadAttentionOptions& options,
                                       const ParameterOptions& parameters)
    : Module("MultiheadAttention"),
      embed_dim_(embed_dim),
      num_heads_(num_heads),
      options_(options),
      in_proj_weight_(register_parameter("in_proj_weight", empty_parameter({3 * embed_dim, embed_dim}, parameters))),
      in_proj_bias_(
          register_parameter("in_proj_bias", options.bias ? empty_parameter({3 * embed_dim}, parameters) : DTensor())),
      out_proj_(register_module(
          "out_proj",
          std::make_shared<Linear>(embed_dim, embed_dim, LinearOptions{.bias = options.bias}, parameters))) {
  DTR_CHECK(num_heads > 0 && embed_dim % num_heads == 0, ValueError,
            "MultiheadAttention: embed_dim {} must be divisible by num_heads {}", embed_dim, num_heads);
  DTR_CHECK(options.dropout >= 0.0 && options.dropout < 1.0, ValueError,
            "MultiheadAttention: dropout {} is not in [0, 1)", options.dropout);
  xavier_uniform_(in_proj_weight_);
  if (options.bias) {
    zeros_(in_proj_bias_);
    zeros_(out_proj_->bias());
  }
}

std::string MultiheadAttention::extra_repr() const {
  return fmt::format("embed_dim={}, num_heads={}, batch_first={}", embed_dim_, num_heads_,
                     options_.batch_first ? "True" : "False");
}

std::pair<DTensor, DTensor> MultiheadAttention::operator()(const DTensor& query, const DTensor& key,
                                                           const DTensor& value, const AttentionMasks& masks) {
  masks_ = masks;
  Values out = Module::operator()(Values{query, key, value, masks.attn_mask, masks.key_padding_mask});
  return {out.at(0), out.size() > 1 ? out[1] : DTensor()};
}

Values MultiheadAttention::forward(const Values& inputs) {
  DTR_CHECK(inputs.size() == 5, ValueError, "MultiheadAttention: forward takes 5 values, got {}", inputs.size());
  const int64_t e = embed_dim_, h = num_heads_, d = e / h;
  // [B, T, E] views of the inputs.
  auto batch_major = [&](const DTensor& x, const char* what) {
    DTR_CHECK(x.defined() && x.dim() == 3 && x.size(2) == e, ValueError,
              "MultiheadAttention: {} must be 3-d with embed_dim {} last ({} layout), got {}", what, e,
              options_.batch_first ? "[B, T, E]" : "[T, B, E]", x.defined() ? fmt::format("{}", x.shape()) : "none");
    return options_.batch_first ? x : transpose(x, 0, 1);
  };
  const DTensor q_in = batch_major(inputs[0], "query"), k_in = batch_major(inputs[1], "key"),
                v_in = batch_major(inputs[2], "value");
  const int64_t b = q_in.size(0), t = q_in.size(1), s = k_in.size(1);
  auto heads = [&](const DTensor& y, int64_t len) { return transpose(reshape(y, {b, len, h, d}), 1, 2); };
  auto optional = [](const DTensor& x) { return x.defined() ? std::optional<DTensor>(x) : std::nullopt; };
  DTensor q, k, v;  // [B, H, len, D]
  // One tensor as query, key and value; what moves or casts inputs on the way here
  // (tensor-parallel layouts, fully_shard's cast, checkpoint's recompute) keeps it one.
  const bool self_attention = inputs[0].is_same(inputs[1]) && inputs[1].is_same(inputs[2]);
  if (self_attention && in_proj_weight_.spec().is_replicated() && deterministic_feature_blocks() == 1) {
    // One product of N = 3E whose columns are q, k and v, as PyTorch projects self-attention:
    // A is packed once, and the input gradient is one product of K = 3E instead of three and
    // two adds. q, k and v have the bits of a product each (a column's sum does not depend on
    // N: kernels/cpu/gemm.h). A tensor-parallel in_proj_weight (StridedShard) and
    // --deterministic's feature blocks take a product per piece below, so that one process
    // with feature blocks gives a tensor-parallel run's bits.
    const std::vector<DTensor> qkv = split(linear(q_in, in_proj_weight_, optional(in_proj_bias_)), e, -1);
    q = heads(qkv[0], t), k = heads(qkv[1], s), v = heads(qkv[2], s);
  } else {
    const std::vector<DTensor> w = split(in_proj_weight_, e, 0);
    const std::vector<DTensor> bias = in_proj_bias_.defined() ? split(in_proj_bias_, e, 0) : std::vector<DTensor>(3);
    q = heads(linear(q_in, w[0], optional(bias[0])), t);
    k = heads(linear(k_in, w[1], optional(bias[1])), s);
    v = heads(linear(v_in, w[2], optional(bias[2])), s);
  }
  const DTensor& attn_mask = inputs[3];
  const DTensor& key_padding_mask = inputs[4];
  const bool dropping = training() && options_.dropout > 0.0;
  DTensor context, weights;
  if (!attn_mask.defined() && !key_padding_mask.defined() && !masks_.need_weights && !dropping) {
    context = scaled_dot_product_attention(q, k, v, masks_.is_causal ? Causal::kYes : Causal::kNo);
  } else {
    DTensor scores = mul(matmul(q, transpose(k, -2, -1)), 1.0 / std::sqrt(static_cast<double>(d)));  // [B, H, T, S]
    const double neg_inf = -std::numeric_limits<double>::infinity();
    if (masks_.is_causal) scores = causal_mask_fill(scores, neg_inf);
    if (attn_mask.defined()) {
      DTR_CHECK((attn_mask.dim() == 2 && attn_mask.shape() == Shape{t, s}) ||
                    (attn_mask.dim() == 3 && attn_mask.shape() == Shape{b * h, t, s}),
                ValueError, "MultiheadAttention: attn_mask must be [{}, {}] or [{}, {}, {}], got {}", t, s, b * h, t, s,
                attn_mask.shape());
      const DTensor m = attn_mask.dim() == 2 ? attn_mask : reshape(attn_mask, {b, h, t, s});
      scores = m.dtype() == kBool ? masked_fill(scores, m, neg_inf) : add(scores, m);
    }
    if (key_padding_mask.defined()) {
      DTR_CHECK(key_padding_mask.dtype() == kBool && key_padding_mask.shape() == (Shape{b, s}), ValueError,
                "MultiheadAttention: key_padding_mask must be bool [{}, {}], got {}{}", b, s, key_padding_mask.dtype(),
                key_padding_mask.shape());
      scores = masked_fill(scores, reshape(key_padding_mask, {b, 1, 1, s}), neg_inf);
    }
    weights = softmax(scores, -1);
    const DTensor used = dropping ? dropout(weights, options_.dropout, next_seed()) : weights;
    context = matmul(used, v);
  }
  DTensor out = (*out_proj_)(reshape(transpose(context, 1, 2), {b, t, e}));  // [B, T, E]
  if (!options_.batch_first) out = transpose(out, 0, 1);
  return {out, masks_.need_weights ? mean(weights, {1}) : DTensor()};
}

}  // namespace dtr::nn
