// The reference model of the FSDP benchmarks (fsdp_bench, overlap_bench): a causal LM of
// vocab 4096, dim 256, 4 layers, 4 heads, sequence 128, float32, seeded, with one random
// batch of 8 sequences per rank sharded over the mesh (Shard(0) of the batch).
#pragma once

#include <cstdint>
#include <string>

#include "dtensor/device_mesh.h"
#include "dtensor/dtensor.h"
#include "nn/transformer.h"

namespace dtr::bench {

struct ReferenceLM {
  static constexpr int64_t kVocab = 4096, kDim = 256, kLayers = 4, kHeads = 4, kSeq = 128, kBatchPerRank = 8;

  // The model's parameters Replicate (ready for fully_shard or replicate), the same on
  // every rank (nn::manual_seed(0)); the batch drawn from its own stream.
  explicit ReferenceLM(const DeviceMesh& mesh);

  // Forward and the cross-entropy loss of the batch.
  DTensor loss();
  // Tokens per step: every rank's sequences.
  int64_t tokens() const { return batch * kSeq; }
  // "causal LM: vocab 4096, dim 256, ...".
  static std::string describe();

  nn::Transformer model;
  int64_t batch;
  DTensor x, y;  // [batch, kSeq] tokens and [batch * kSeq] next tokens
};

}  // namespace dtr::bench
