// MultiheadAttention (every mask kind, both layouts) and the seed's Transformer and its
// causal variant against PyTorch 2.15: the same weights give the outputs, attention
// weights, loss and every gradient within 1e-5 relative (max norm) in float32, and the
// state-dict names are PyTorch's; the loss and gradients also when the model is called with
// the targets (the fused output projection and cross-entropy). The data:
// tests/nn/testdata/make_transformer_testdata.py.
#include <catch2/catch.hpp>

#include <memory>

#include "checkpoint/full_state_dict.h"
#include "dtensor/ops/loss.h"
#include "dtensor/ops/view_ops.h"
#include "nn/parameter.h"
#include "nn/transformer.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/test_util.h"

namespace dtr::nn {
namespace {

using checkpoint::load_full_state_dict;
using safetensors::load_file;

using testing::on_one_rank;
using testing::relative_max_error;

// The file's tensors, and its state.* entries loaded into `module` (every key matching).
TensorMap load_case(const std::string& name, Module& module) {
  const TensorMap data = load_file("tests/nn/testdata/transformer/" + name + ".safetensors");
  TensorMap state;
  for (const auto& [key, t] : data) {
    if (key.starts_with("state.")) state.emplace(key.substr(6), t);
  }
  load_full_state_dict(module, state);
  return data;
}

void check_gradients(Module& module, const TensorMap& data) {
  int grads = 0;
  for (auto& [param, p] : module.named_parameters()) {
    INFO("gradient of " << param);
    REQUIRE(p->grad().defined());
    CHECK(relative_max_error(p->grad().to_local(), data.at("grad." + param)) <= 1e-5);
    ++grads;
  }
  int expected = 0;
  for (const auto& [key, t] : data) expected += key.starts_with("grad.");
  CHECK(grads == expected);
}

TEST_CASE("MultiheadAttention matches PyTorch with every kind of mask", "[nn][golden][attention]") {
  for (const char* name :
       {"mha", "mha_seq_first", "mha_bool_mask", "mha_additive_mask", "mha_key_padding", "mha_causal"}) {
    INFO(name);
    const bool batch_first = std::string(name) != "mha_seq_first";
    MultiheadAttention mha(8, 2, {.batch_first = batch_first});
    const TensorMap data = load_case(name, mha);
    AttentionMasks masks;
    if (data.count("attn_mask")) masks.attn_mask = on_one_rank(data.at("attn_mask"));
    if (data.count("key_padding_mask")) masks.key_padding_mask = on_one_rank(data.at("key_padding_mask"));
    masks.is_causal = std::string(name) == "mha_causal";
    const auto [out, weights] =
        mha(on_one_rank(data.at("query")), on_one_rank(data.at("key")), on_one_rank(data.at("value")), masks);
    CHECK(relative_max_error(out.to_local(), data.at("output")) <= 1e-5);
    CHECK(relative_max_error(weights.to_local(), data.at("weights")) <= 1e-5);
    out.backward(on_one_rank(data.at("grad_output")));
    check_gradients(mha, data);
  }
}

TEST_CASE("the seed's Transformer and its causal variant match PyTorch", "[nn][golden][transformer]") {
  for (const bool causal : {false, true}) {
    for (const bool with_targets : {false, true}) {
      INFO((causal ? "causal_lm" : "seed") << (with_targets ? ", called with the targets" : ""));
      const TransformerConfig config{.vocab_size = 32,
                                     .dim = 16,
                                     .n_layers = 2,
                                     .n_heads = 2,
                                     .causal = causal,
                                     .max_seq_len = causal ? 8 : 0,
                                     .final_norm = causal,
                                     .tie_embeddings = causal};
      Transformer model(config);
      const TensorMap data = load_case(causal ? "causal_lm" : "seed", model);
      const DTensor tokens = on_one_rank(data.at("tokens"));
      DTensor loss;
      if (with_targets) {
        loss = model(tokens, on_one_rank(data.at("targets")));
      } else {
        const DTensor logits = model(tokens);
        CHECK(relative_max_error(logits.to_local(), data.at("logits")) <= 1e-5);
        loss = cross_entropy(reshape(logits, {16, 32}), on_one_rank(data.at("targets").reshape({16})));
      }
      CHECK(relative_max_error(loss.to_local(), data.at("loss")) <= 1e-5);
      loss.backward();
      check_gradients(model, data);
    }
  }
  // PyTorch's names, in PyTorch's order.
  Transformer seed({.vocab_size = 32, .dim = 16, .n_layers = 1, .n_heads = 2});
  std::vector<std::string> names;
  for (const auto& [name, value] : seed.state_dict()) names.push_back(name);
  CHECK(names == std::vector<std::string>{
                     "embed.weight", "layers.0.norm1.weight", "layers.0.norm1.bias", "layers.0.attn.in_proj_weight",
                     "layers.0.attn.in_proj_bias", "layers.0.attn.out_proj.weight", "layers.0.attn.out_proj.bias",
                     "layers.0.norm2.weight", "layers.0.norm2.bias", "layers.0.ffn.0.weight", "layers.0.ffn.0.bias",
                     "layers.0.ffn.2.weight", "layers.0.ffn.2.bias", "output.weight", "output.bias"});
}

}  // namespace
}  // namespace dtr::nn
