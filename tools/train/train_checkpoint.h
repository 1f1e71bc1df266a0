// The train program's checkpoints (--use-dcp-checkpointing): the model's parameters, AdamW's
// state and step counts, the step and the data position, saved with dtensor/checkpoint.h
// (each rank its own shards) into <checkpoint-dir>/step_<8 digits>, and loaded back on any
// mesh and world size (the checkpoint reshards).
//
// Names: "model.<parameter name>" (PyTorch's), "optim.<parameter index>.<state name>"
// ("exp_avg", "exp_avg_sq"); `extra` holds {"step", "window" (the data position: the next
// window of token_data.h's order), "optim": {index: {"step", "dtypes": {name: dtype}}}}.
// A step's checkpoint is committed atomically; the older ones beyond --keep-last are
// deleted only after a newer one committed.
#pragma once

#include <cstdint>
#include <string>

#include "nn/module.h"
#include "optim/optimizer.h"

namespace dtr::train {

// Where the run stands: what a checkpoint restores besides the tensors.
struct RunPosition {
  int64_t step = 0;    // optimizer steps taken
  int64_t window = 0;  // the next window of the data order
};

// The directory of the checkpoint after `step` steps.
std::string checkpoint_path(const std::string& checkpoint_dir, int64_t step);

// Saves the run after position.step steps, then deletes all but the newest `keep_last`
// committed checkpoints (rank 0). Collective.
void save_checkpoint(const std::string& checkpoint_dir, int64_t keep_last, const RunPosition& position,
                     nn::Module& model, optim::Optimizer& opt);

// The checkpoint --resume names: "latest" is the newest committed step_* under
// checkpoint_dir ("" when there is none yet: a fresh start), anything else a path.
std::string resume_path(const std::string& resume, const std::string& checkpoint_dir);

// Loads a checkpoint into the model's parameters (in place: the leaves stay the same
// objects) and the optimizer, and returns the position. Collective.
RunPosition load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt);

}  // namespace dtr::train
