// The seed's Transformer, and the GPT-style model it becomes with a few config fields.
//
// TransformerBlock(dim, heads): x = x + attn(norm1(x), norm1(x), norm1(x)), then
// x = x + ffn(norm2(x)) with ffn = Sequential(Linear(dim, 4 dim), ReLU(inplace), Linear(4 dim, dim))
// (in place: the first Linear's output is nobody else's, so the hidden activation has one
// buffer, not two, while ReLU runs);
// with dropout p, on the attention weights and on each branch before its residual add
// (GPT-2's places; training mode only).
// Transformer: embed, layers.0 .. layers.N-1, output; with the config's options also a
// learned position embedding (pos_embed), a final LayerNorm (norm) and the output weight
// tied to embed.weight. State-dict names are those of the same module in PyTorch
// (embed.weight, layers.0.attn.in_proj_weight, layers.0.ffn.0.weight, output.weight, ...).
// Called with tokens it gives the logits; with tokens and targets, the mean cross-entropy
// (a language model's loss with labels), which never holds the [B x T, vocab] logits
// (linear_cross_entropy) where the output projection runs as a plain forward; where calling
// it does more (a tensor-parallel style, its own fully_shard) the output module runs and
// cross_entropy follows.
#pragma once

#include <memory>

#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/norm.h"

namespace dtr::nn {

struct TransformerConfig {
  int64_t vocab_size = 0;
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  bool causal = false;          // attention sees earlier tokens only
  int64_t max_seq_len = 0;      // > 0: a learned position embedding of that many positions
  bool final_norm = false;      // a LayerNorm before the output projection
  bool tie_embeddings = false;  // output.weight is embed.weight (the output has no bias then)
  double dropout = 0.0;         // in every block (see TransformerBlock)
};

class TransformerBlock : public UnaryModule {
 public:
  TransformerBlock(int64_t dim, int64_t n_heads, bool causal = false, const ParameterOptions& options = {},
                   double dropout = 0.0);

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& x) override;  // [B, T, dim]

 private:
  bool causal_;
  std::shared_ptr<LayerNorm> norm1_;
  std::shared_ptr<MultiheadAttention> attn_;
  std::shared_ptr<LayerNorm> norm2_;
  std::shared_ptr<Sequential> ffn_;
  std::shared_ptr<Dropout> dropout_;  // null without dropout
};

class Transformer : public Module {
 public:
  explicit Transformer(const TransformerConfig& config, const ParameterOptions& options = {});
  const TransformerConfig& config() const { return config_; }
  ModuleList& layers() { return *layers_; }

  using Module::operator();
  // int [B, T] -> logits [B, T, vocab]
  DTensor operator()(const DTensor& tokens) { return Module::operator()(Values{tokens}).at(0); }
  // int [B, T] and int64 targets [B, T] -> the loss (0-d): the mean cross-entropy over the
  // targets not equal to -100 (cross_entropy's defaults).
  DTensor operator()(const DTensor& tokens, const DTensor& targets) {
    return Module::operator()(Values{tokens, targets}).at(0);
  }

  // With tie_embeddings: the output layer reads the tied weight through a leaf of its own
  // (sharing its storage) while `apart` is set, so that backward leaves the output layer's
  // part of the weight's gradient there, unreduced (as it arrives: Partial over the ranks that
  // split the batch), and only the embedding's part reaches the weight. train --deterministic, when a step runs in
  // several micro-batches, sums each part over them on its own and adds them at the end, as one step over the whole
  // batch adds the two (docs/deterministic.md). No effect without tie_embeddings.
  void set_tied_gradient_apart(bool apart) { tied_apart_ = apart; }
  // The output layer's part from the last forward's backward (undefined unless apart and
  // tied), and lets go of it.
  DTensor take_tied_output_grad();

 protected:
  Values forward(const Values& inputs) override;

 private:
  // [B, T] -> the last hidden states [B, T, dim], before the output projection.
  DTensor hidden(const DTensor& tokens);

  TransformerConfig config_;
  std::shared_ptr<Embedding> embed_;
  std::shared_ptr<Embedding> pos_embed_;
  std::shared_ptr<ModuleList> layers_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Linear> output_;
  bool tied_apart_ = false;
  DTensor tied_output_;  // the output layer's leaf for the tied weight while apart
};

}  // namespace dtr::nn
