// The expected time of one FSDP (ZeRO-3) training step of dtr's Transformer on N GPUs, from
// a collectives cost model (collectives/cost_model.h) and an assumed compute efficiency:
// what docs/gpu_scaling.md plans 8 and 64 H200s with.
//
// Per block (12 d^2 + 13 d parameters: attention's four projections, the 4d MLP, two
// LayerNorms; the embedding, positions and final norm form the root's group), per step
// and rank: a forward all-gather of its bf16 parameters, another in backward (resharded
// after forward), a float32 reduce-scatter of its gradients; the root gathers once and
// keeps its parameters. Compute per block: 2 FLOPs per parameter and token forward plus
// attention's 4 T d, backward twice forward, at `compute_efficiency` of the dense peak.
// Overlap as FSDP2's implicit prefetch one group ahead gives it, with every collective on
// one communication stream in issue order:
//   forward:  block i+1's all-gather runs during block i's compute; block 0's behind the
//             root's (embedding) compute only;
//   backward: block i-1's all-gather and block i+1's reduce-scatter run during block i's;
//             block L-1's all-gather during the output projection's backward; the last
//             reduce-scatters (block 0's, the root's) after all compute;
// each window exposes what its collectives take beyond its compute. The optimizer step
// (AdamW on the 1/N shard) is HBM-bound: 28 bytes per parameter at `hbm_bytes_per_s`.
#pragma once

#include <cstdint>

#include "collectives/cost_model.h"

namespace dtr::bench {

struct PlanModel {
  int64_t layers = 0, dim = 0, vocab = 0, seq_len = 0, batch_per_gpu = 1;
};

struct PlanCluster {
  int64_t gpus = 0;
  double peak_tflops = 0;         // dense bf16
  double hbm_bytes_per_s = 0;     // for the optimizer step
  double compute_efficiency = 0;  // achieved share of the peak in the model's kernels
};

struct StepPlan {
  int64_t parameters = 0;
  int64_t all_gather_bytes = 0, reduce_scatter_bytes = 0;  // per rank and step (nccl-tests sizes)
  double compute_s = 0, all_gather_s = 0, reduce_scatter_s = 0, exposed_s = 0, optimizer_s = 0;
  double step_s = 0;
  double tokens_per_s_per_gpu = 0;
  double mfu = 0;  // 6N + 12 L d T FLOPs per token (tools/train/mfu.h) over the peak
  // The share of the collectives' time that ran behind compute.
  double hidden_share() const {
    const double comm = all_gather_s + reduce_scatter_s;
    return comm > 0 ? 1 - exposed_s / comm : 1;
  }
};

// ValueError naming the field for a non-positive size, efficiency or bandwidth, or a cost
// model without all_gather and reduce_scatter fits.
StepPlan plan_fsdp_step(const PlanModel& model, const PlanCluster& cluster, const CostModel& nccl);

}  // namespace dtr::bench
