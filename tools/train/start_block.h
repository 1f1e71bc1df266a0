// What the train program's rank 0 prints and writes before step 1. The start block is a
// line per topic, its name in a 10-column field: world, device and mfu (--device cuda),
// mesh, parallel, model, placements, data, batch, eval (--eval-every > 0), per rank (the
// bytes of parameters, gradients and AdamW state) and resumed (from a checkpoint):
//   model      gpt (2 layers, dim 32, 2 heads, vocab 256, seq 16): 34176 parameters
//   placements 28 x (S(0))
// The files: OUT/config.json (the command line, world size, vocabulary and every flag's
// value) and, for a BPE tokenizer, OUT/tokenizer.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "dtensor/device_mesh.h"
#include "nn/transformer.h"
#include "tools/train/step_log.h"
#include "tools/train/token_data.h"
#include "tools/train/train_checkpoint.h"
#include "tools/train/train_config.h"
#include "tools/train/train_data.h"

namespace dtr::train {

// Writes OUT/config.json and, for BPE, OUT/tokenizer.json.
void write_run_config(const TrainConfig& config, const std::vector<std::string>& argv, int64_t world, int64_t vocab,
                      const TrainData& data);

// Prints the start block (and flushes stdout): `device` is rank 0's, `resumed_from` the
// checkpoint the run resumed from ("" for none) at `start_at`.
void print_start_block(const TrainConfig& config, const Device& device, const DeviceMesh& mesh, nn::Transformer& net,
                       const TrainData& data, int64_t vocab, const WindowOrder& val_order, const Throughput& throughput,
                       const std::string& resumed_from, const RunPosition& start_at);

}  // namespace dtr::train
