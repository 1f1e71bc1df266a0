#include "nn/transformer_plan.h"

#include <memory>

#include "core/error.h"

namespace dtr::nn {

ParallelPlan transformer_tp_plan(const TransformerConfig& config, TransformerTpOptions options) {
  DTR_CHECK(options.split_vocab || (!options.sequence_parallel && !options.loss_parallel), ValueError,
            "transformer_tp_plan: sequence_parallel={} and loss_parallel={} with split_vocab=false; sequence and "
            "loss parallelism start and end at the vocabulary's split layers; legal: split_vocab=true, or neither",
            options.sequence_parallel, options.loss_parallel);
  // Where activations travel between the parallel layers: whole, or split along the sequence.
  const Placement between = options.sequence_parallel ? Shard(1) : Replicate();
  ParallelPlan plan = {
      {"layers.*.attn", std::make_shared<ColwiseParallel>(Layouts{between, Shard(-1)})},
      {"layers.*.attn.out_proj", std::make_shared<RowwiseParallel>(Layouts{Shard(-1), between})},
      {"layers.*.ffn.0", std::make_shared<ColwiseParallel>(Layouts{between, Shard(-1)})},
      {"layers.*.ffn.2", std::make_shared<RowwiseParallel>(Layouts{Shard(-1), between})},
  };
  if (options.split_vocab) {
    plan["embed"] = std::make_shared<RowwiseParallel>(Layouts{Replicate(), between});
    plan["output"] =
        std::make_shared<ColwiseParallel>(Layouts{between, options.loss_parallel ? Shard(-1) : Replicate()});
  }
  if (options.sequence_parallel) {
    for (const char* norm : {"layers.*.norm1", "layers.*.norm2"}) plan[norm] = std::make_shared<SequenceParallel>();
    if (config.dropout > 0.0) plan["layers.*.dropout"] = std::make_shared<SequenceParallel>();
    if (config.final_norm) plan["norm"] = std::make_shared<SequenceParallel>();
  }
  return plan;
}

}  // namespace dtr::nn
