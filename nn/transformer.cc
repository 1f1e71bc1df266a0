#include "nn/transformer.h"

#include "core/error.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/fill.h"
#include "nn/activation.h"
#include "nn/loss.h"

namespace dtr::nn {

TransformerBlock::TransformerBlock(int64_t dim, int64_t n_heads, bool causal, const ParameterOptions& options,
                                   double dropout)
    : UnaryModule("TransformerBlock"),
      causal_(causal),
      norm1_(register_module("norm1", std::make_shared<LayerNorm>(Shape{dim}, LayerNormOptions{}, options))),
      attn_(register_module(
          "attn", std::make_shared<MultiheadAttention>(
                      dim, n_heads, MultiheadAttentionOptions{.batch_first = true, .dropout = dropout}, options))),
      norm2_(register_module("norm2", std::make_shared<LayerNorm>(Shape{dim}, LayerNormOptions{}, options))),
      ffn_(register_module("ffn", std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
                                      std::make_shared<Linear>(dim, 4 * dim, LinearOptions{}, options),
                                      std::make_shared<ReLU>(/*inplace=*/true),
                                      std::make_shared<Linear>(4 * dim, dim, LinearOptions{}, options)}))) {
  if (dropout > 0) dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout));
}

DTensor TransformerBlock::forward(const DTensor& x) {
  auto branch = [&](DTensor b) { return dropout_ ? (*dropout_)(b) : b; };
  const DTensor h = (*norm1_)(x);
  DTensor a = (*attn_)(h, h, h, AttentionMasks{.is_causal = causal_, .need_weights = false}).first;
  // Each residual sum goes into its branch's output (add_), which nothing reads after it: one
  // buffer fewer per add while the block runs (x + b and b + x are the same bits).
  const DTensor y = add_(branch(std::move(a)), x);
  return add_(branch((*ffn_)((*norm2_)(y))), y);
}

Transformer::Transformer(const TransformerConfig& config, const ParameterOptions& options)
    : Module("Transformer"), config_(config) {
  DTR_CHECK(config.vocab_size > 0 && config.dim > 0 && config.n_layers >= 0 && config.n_heads > 0, ValueError,
            "Transformer: vocab_size {}, dim {}, n_layers {} and n_heads {} must be positive", config.vocab_size,
            config.dim, config.n_layers, config.n_heads);
  embed_ = register_module("embed", std::make_shared<Embedding>(config.vocab_size, config.dim, std::nullopt, options));
  if (config.max_seq_len > 0) {
    pos_embed_ = register_module("pos_embed",
                                 std::make_shared<Embedding>(config.max_seq_len, config.dim, std::nullopt, options));
  }
  layers_ = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config.n_layers; ++i) {
    layers_->append(
        std::make_shared<TransformerBlock>(config.dim, config.n_heads, config.causal, options, config.dropout));
  }
  if (config.final_norm) {
    norm_ = register_module("norm", std::make_shared<LayerNorm>(Shape{config.dim}, LayerNormOptions{}, options));
  }
  output_ = register_module("output", std::make_shared<Linear>(config.dim, config.vocab_size,
                                                               LinearOptions{.bias = !config.tie_embeddings}, options));
  if (config.tie_embeddings) output_->weight() = embed_->weight();
}

DTensor Transformer::hidden(const DTensor& tokens) {
  DTR_CHECK(tokens.dim() == 2, ValueError, "Transformer: tokens must be [batch, seq], got {}", tokens.shape());
  DTensor x = (*embed_)(tokens);
  if (pos_embed_) {
    const int64_t t = tokens.size(1);
    DTR_CHECK(t <= config_.max_seq_len, ValueError, "Transformer: {} tokens per sequence but max_seq_len is {}", t,
              config_.max_seq_len);
    const DeviceMesh& mesh = tokens.mesh();
    const Tensor positions = arange(0, static_cast<double>(t), 1, kInt64, mesh.device());
    x = add(x, (*pos_embed_)(DTensor(positions, DTensorSpec(mesh, Placements(mesh.ndim(), Replicate()), {t}, kInt64))));
  }
  for (size_t i = 0; i < layers_->size(); ++i) x = layers_->at<TransformerBlock>(i)(x);
  if (norm_) x = (*norm_)(x);
  return x;
}

Values Transformer::forward(const Values& inputs) {
  DTR_CHECK(inputs.size() == 1 || inputs.size() == 2, ValueError,
            "Transformer: takes tokens [batch, seq] (-> logits) or tokens and targets (-> the loss), got {} tensors",
            inputs.size());
  const DTensor x = hidden(inputs[0]);
  if (inputs.size() == 1) return {(*output_)(x)};
  const DTensor& targets = inputs[1];
  DTR_CHECK(targets.shape() == inputs[0].shape(), ValueError, "Transformer: targets {} must have the tokens' shape {}",
            targets.shape(), inputs[0].shape());
  if (output_->has_hooks()) {
    const int64_t rows = targets.numel();
    return {cross_entropy(reshape((*output_)(x), {rows, config_.vocab_size}), reshape(targets, {rows}))};
  }
  DTensor weight = output_->weight();
  if (tied_apart_ && config_.tie_embeddings) {
    DTR_CHECK(!tied_output_.defined(), ValueError,
              "Transformer: a forward with the tied weight's gradient apart while the last one's output part was "
              "not taken (take_tied_output_grad)");
    tied_output_ = weight.detach();
    tied_output_.requires_grad_();
    // Kept unreduced, Partial over the mesh dims that split the batch: the caller reduces it.
    Placements unreduced = weight.placements();
    DTR_INTERNAL_ASSERT(x.mesh() == weight.mesh(), "Transformer: the hidden states and the tied weight on two meshes");
    for (size_t d = 0; d < unreduced.size(); ++d) {
      if (x.placements()[d].is_shard(0)) unreduced[d] = Partial();
    }
    tied_output_.set_grad_placements(unreduced);
    weight = tied_output_;
  }
  return {linear_cross_entropy(x, weight, output_->bias(), targets)};
}

DTensor Transformer::take_tied_output_grad() {
  DTensor grad = tied_output_.defined() ? tied_output_.grad() : DTensor();
  tied_output_ = DTensor();
  return grad;
}

}  // namespace dtr::nn
