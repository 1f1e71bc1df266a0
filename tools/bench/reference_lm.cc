#include "tools/bench/reference_lm.h"

#include <fmt/format.h>

#include "dtensor/ops/view_ops.h"
#include "kernels/random.h"
#include "nn/init.h"
#include "nn/loss.h"

namespace dtr::bench {
namespace {

nn::TransformerConfig config() {
  nn::manual_seed(0);  // the parameters are drawn as the model is built
  nn::TransformerConfig c;
  c.vocab_size = ReferenceLM::kVocab;
  c.dim = ReferenceLM::kDim;
  c.n_layers = ReferenceLM::kLayers;
  c.n_heads = ReferenceLM::kHeads;
  c.causal = true;
  c.max_seq_len = ReferenceLM::kSeq;
  c.final_norm = true;
  return c;
}

}  // namespace

ReferenceLM::ReferenceLM(const DeviceMesh& mesh) : model(config(), {}), batch(kBatchPerRank * mesh.size()) {
  Tensor u = Tensor::empty({batch, kSeq + 1}, kFloat64);
  uniform_(u, 0, static_cast<double>(kVocab) - 0.5, 1);
  const Tensor ids = u.to(kInt64);
  x = distribute_tensor(ids.narrow(1, 0, kSeq).contiguous(), mesh, {Shard(0)});
  y = reshape(distribute_tensor(ids.narrow(1, 1, kSeq).contiguous(), mesh, {Shard(0)}), {batch * kSeq});
}

DTensor ReferenceLM::loss() { return nn::cross_entropy(reshape(model(x), {batch * kSeq, kVocab}), y); }

std::string ReferenceLM::describe() {
  return fmt::format("causal LM: vocab {}, dim {}, {} layers, {} heads, seq {}, {} sequences per rank, float32", kVocab,
                     kDim, kLayers, kHeads, kSeq, kBatchPerRank);
}

}  // namespace dtr::bench
