// Helpers of the nn and optim tests: a tensor as a DTensor on the one-rank mesh, the
// relative max-norm error the golden tests state their tolerances in, the small causal
// model the multi-rank training tests share, and the comparison of a parallel run's
// weights with one rank's.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "nn/parameter.h"
#include "nn/transformer.h"
#include "tests/testing/test_util.h"

namespace dtr::testing {

// t as a Replicate DTensor on single_rank_mesh().
inline DTensor on_one_rank(const Tensor& t) {
  return DTensor(t, DTensorSpec(single_rank_mesh(), {Replicate()}, t.shape(), t.dtype()));
}

// A small GPT-style model: dim 16, 2 blocks of 2 heads, causal, a final norm, tied embeddings.
inline nn::TransformerConfig small_causal_lm(int64_t vocab, int64_t seq) {
  return {.vocab_size = vocab,
          .dim = 16,
          .n_layers = 2,
          .n_heads = 2,
          .causal = true,
          .max_seq_len = seq,
          .final_norm = true,
          .tie_embeddings = true};
}

// The tensor-parallel tests' tiny Transformer (dim 8, 2 blocks): the seed's, or with `gpt`
// its GPT variant (causal, position embedding, final norm, tied output, dropout 0.1).
inline nn::TransformerConfig tiny_transformer(int64_t vocab, int64_t seq, int64_t heads, bool gpt) {
  return {.vocab_size = vocab,
          .dim = 8,
          .n_layers = 2,
          .n_heads = heads,
          .causal = gpt,
          .max_seq_len = gpt ? seq : 0,
          .final_norm = gpt,
          .tie_embeddings = gpt,
          .dropout = gpt ? 0.1 : 0.0};
}

// max |a - b| / max |b|, with b the reference (PyTorch's values); max |a - b| when b is 0.
inline double relative_max_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = to_f64(a), y = to_f64(b);
  REQUIRE(x.size() == y.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

// Every weight of `got` within `tolerance` of `expected`'s (a run on one rank), but for the
// key third of an attention's packed in_proj_bias: its gradient is exactly zero (softmax
// ignores a shift of a query's scores), so it only collects rounding noise, which AdamW
// turns into +-lr steps either way; its query and value thirds are compared.
inline void check_weights_close(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& expected,
                                Tolerance tolerance) {
  for (const auto& [name, w] : expected) {
    if (!name.ends_with("in_proj_bias")) {
      check_close(got.at(name), w, tolerance, name);
      continue;
    }
    const int64_t e = w.size(0) / 3;
    for (int64_t third : {0, 2})
      check_close(got.at(name).narrow(0, third * e, e), w.narrow(0, third * e, e), tolerance, name);
  }
}

}  // namespace dtr::testing
