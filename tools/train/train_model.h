// The train program's model: the causal Transformer --arch (and its four overrides) and the
// sizes describe, initialised from --seed (GPT-2's N(0, 0.02) embeddings for gpt) or loaded
// from --init-from, and parallelised as --parallel says: fully_shard on each block and then
// on the root (fsdp; hsdp shards over the mesh's last dim), replicate (ddp), or nothing
// (none: the model lives on its own one-rank mesh). With --tp, parallelize_module on
// mesh["tp"] first, and fully_shard or replicate over the other dims (FSDP / HSDP / DDP x TP). The root keeps its
// parameters through backward and gives float32 logits for the loss; blocks reshard per
// --reshard-after-forward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/device_mesh.h"
#include "nn/fully_shard.h"
#include "nn/replicate.h"
#include "nn/transformer.h"
#include "tools/train/train_config.h"

namespace dtr::train {

struct Model {
  std::unique_ptr<nn::Transformer> net;
  std::vector<nn::FSDPModule*> blocks;  // fsdp/hsdp
  nn::FSDPModule* root = nullptr;       // fsdp/hsdp
  nn::DDPModule* ddp = nullptr;         // ddp

  // Whether the next backward synchronises gradients (set_requires_gradient_sync): only
  // the last micro-batch of a step does.
  void set_gradient_sync(bool sync) {
    if (root != nullptr) root->set_requires_gradient_sync(sync);
    if (ddp != nullptr) ddp->set_requires_gradient_sync(sync);
  }
};

// The mesh of `world_size` ranks of `device_type` that --mesh (or --parallel's default)
// names; --parallel none: a one-rank mesh of its own. Collective (but for none).
DeviceMesh training_mesh(const TrainConfig& config, DeviceType device_type, int64_t world_size);

// The model on `mesh`. ValueError when --init-from does not match it (rank 0 then lists
// every name in OUT/init_from_mismatch.txt). Collective.
Model build_model(const TrainConfig& config, int64_t vocab, const DeviceMesh& mesh);

// How many parameters each placement has, e.g. "2 x (R), 26 x (S(0))"; with the mesh dims
// they are on where those are not the training mesh's (FSDP x TP's tp-first view:
// "4 x (SS(0,3), S(0)) on (tp, dp)").
std::string placements_summary(nn::Transformer& net, const DeviceMesh& mesh);

// The model's parameter count (global, not this rank's).
int64_t parameter_count(nn::Transformer& net);

}  // namespace dtr::train
