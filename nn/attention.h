// MultiheadAttention (torch.nn.MultiheadAttention): packed in_proj_weight [3E, E] and
// in_proj_bias [3E], out_proj a Linear(E, E); PyTorch's names, initialisation and masks.
#pragma once

#include <memory>

#include "nn/linear.h"
#include "nn/module.h"
#include "nn/parameter.h"

namespace dtr::nn {

struct MultiheadAttentionOptions {
  bool bias = true;
  bool batch_first = false;  // inputs [B, T, E] when true, [T, B, E] otherwise (PyTorch's default)
  double dropout = 0.0;      // on the attention weights, in training mode
};

// What a call takes besides query, key and value (all optional).
struct AttentionMasks {
  // [T, S] or [B * heads, T, S]: bool (true = not allowed) or additive floating.
  DTensor attn_mask = {};
  // [B, S] bool: true = the key is padding.
  DTensor key_padding_mask = {};
  bool is_causal = false;    // query i sees keys j <= i
  bool need_weights = true;  // also return the weights averaged over heads, [B, T, S]
};

class MultiheadAttention : public Module {
 public:
  // in_proj_weight xavier_uniform_, in_proj_bias and out_proj.bias zeros (PyTorch's).
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, const MultiheadAttentionOptions& options = {},
                     const ParameterOptions& parameters = {});
  // (output, weights): weights undefined unless masks.need_weights.
  std::pair<DTensor, DTensor> operator()(const DTensor& query, const DTensor& key, const DTensor& value,
                                         const AttentionMasks& masks = {});
  std::string extra_repr() const override;
  int64_t num_heads() const { return num_heads_; }

 protected:
  // Values: query, key, value, then attn_mask and key_padding_mask (undefined when absent).
  Values forward(const Values& inputs) override;

 private:
  int64_t embed_dim_, num_heads_;
  MultiheadAttentionOptions options_;
  AttentionMasks masks_;  // the current call's flags, read by forward
  DTensor& in_proj_weight_;
  DTensor& in_proj_bias_;
  std::shared_ptr<Linear> out_proj_;
};

}  // namespace dtr::nn
