// The tensor-parallel plan of the seed Transformer (nn/transformer.h), Megatron's layout:
// in each block the attention's heads and the FFN's hidden features split over the tp ranks
// (attention: ColwiseParallel on its packed q/k/v projection, RowwiseParallel on out_proj;
// FFN: ColwiseParallel on ffn.0, RowwiseParallel on ffn.2), the embedding's vocabulary rows
// split (masked lookups; a tied output weight shares the placement), the output projection
// column-parallel over the vocabulary. Position embeddings stay Replicate.
//
// With sequence parallelism the activations between blocks are Shard(1) (the sequence): the
// norms and dropout run on them, each rowwise layer reduce-scatters instead of all-reducing,
// each colwise layer all-gathers its input. With loss parallelism the logits stay Shard(-1)
// (classes) for cross_entropy, which never gathers them. docs/tensor_parallel.md has the
// collectives per step.
#pragma once

#include "nn/tensor_parallel.h"
#include "nn/transformer.h"

namespace dtr::nn {

struct TransformerTpOptions {
  bool sequence_parallel = false;
  bool loss_parallel = false;
  // false: the embedding and the output projection stay whole on every tp rank (train
  // --deterministic: the vocabulary's reductions, the loss's sum of exponentials among them,
  // then run as on one rank, in the fused loss kernel; docs/deterministic.md).
  bool split_vocab = true;
};

// The plan for parallelize_module on a Transformer built from `config`.
ParallelPlan transformer_tp_plan(const TransformerConfig& config, TransformerTpOptions options = {});

}  // namespace dtr::nn
