#include "nn/embedding.h"

#include "core/error.h"
#include "dtensor/autograd.h"
#include "dtensor/ops/embedding.h"
#include "dtensor/ops/view_ops.h"
#include "dtensor/ops/where.h"
#include "kernels/fill.h"
#include "nn/init.h"

namespace dtr::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx,
                     const ParameterOptions& options)
    : UnaryModule("Embedding"),
      num_embeddings_(num_embeddings),
      embedding_dim_(embedding_dim),
      weight_(register_parameter("weight", empty_parameter({num_embeddings, embedding_dim}, options))) {
  DTR_CHECK(num_embeddings > 0 && embedding_dim > 0, ValueError,
            "Embedding: num_embeddings {} and embedding_dim {} must be positive", num_embeddings, embedding_dim);
  if (padding_idx) {
    DTR_CHECK(*padding_idx >= -num_embeddings && *padding_idx < num_embeddings, IndexError,
              "Embedding: padding_idx {} is outside [-{}, {})", *padding_idx, num_embeddings, num_embeddings);
    padding_idx_ = *padding_idx < 0 ? *padding_idx + num_embeddings : *padding_idx;
  }
  normal_(weight_, 0.0, 1.0);
  if (padding_idx_) {
    Tensor row = weight_.to_local().narrow(0, *padding_idx_, 1);  // the weight starts Replicate
    fill_(row, 0.0);
  }
}

std::string Embedding::extra_repr() const {
  return fmt::format("{}, {}{}", num_embeddings_, embedding_dim_,
                     padding_idx_ ? fmt::format(", padding_idx={}", *padding_idx_) : "");
}

DTensor Embedding::forward(const DTensor& indices) {
  DTensor y = embedding(weight_, indices);
  if (!padding_idx_) return y;
  // The padding row's value, but no gradient into it: padding positions see a detached copy.
  const DTensor padding = unsqueeze(eq(indices, static_cast<double>(*padding_idx_)), -1);
  return where(padding, y.detach(), y);
}

}  // namespace dtr::nn
