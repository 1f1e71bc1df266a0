// Embedding (torch.nn.Embedding): rows of weight [num_embeddings, embedding_dim] by index.
#pragma once

#include <optional>

#include "nn/module.h"
#include "nn/parameter.h"

namespace dtr::nn {

class Embedding : public UnaryModule {
 public:
  // weight ~ N(0, 1); the padding_idx row (negative counts from the end) is zeroed and gets
  // no gradient, as in PyTorch.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx = std::nullopt,
            const ParameterOptions& options = {});
  DTensor& weight() { return weight_; }
  std::string extra_repr() const override;

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& indices) override;

 private:
  int64_t num_embeddings_, embedding_dim_;
  std::optional<int64_t> padding_idx_;
  DTensor& weight_;
};

}  // namespace dtr::nn
