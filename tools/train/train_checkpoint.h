// The train program's checkpoints (--use-dcp-checkpointing): the model's parameters, AdamW's
// state and step counts, the step and the data position, saved with checkpoint/save.h
// (each rank its own shards) into <checkpoint-dir>/step_<8 digits>, and loaded back on any
// mesh and world size (the checkpoint reshards).
//
// Names: "model.<parameter name>" (PyTorch's), "optim.<parameter index>.<state name>"
// ("exp_avg", "exp_avg_sq"); `extra` holds {"step", "window" (the data position: the next
// window of token_data.h's order), "rng" (nn's seed sequence: dropout masks continue
// exactly), "optim": {index: {"step", "dtypes": {name: dtype}}}, "model" (model_flags(),
// train_config.h: what the tensors mean)}.
// Saves are asynchronous: the state is staged to host memory and written by a background
// thread while training goes on; a save is committed atomically when the next one starts
// (or at the end of the run), and the older ones beyond --keep-last are deleted only after
// a newer one committed. Rank 0 prints each commit and load with its global size, and the
// progress of a save or load that takes over 2 s.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "checkpoint/save.h"
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

// The run's saves, one in flight at a time. Collective, like the checkpoint's save.
class Checkpointer {
 public:
  Checkpointer(std::string checkpoint_dir, int64_t keep_last, nlohmann::json model_flags);
  // Commits the previous save, then stages the run after position.step steps and starts
  // writing it in the background.
  void save(const RunPosition& position, nn::Module& model, optim::Optimizer& opt);
  // Whether this rank's part of the save in flight is written (true when none is in
  // flight): once every rank's is, commit() costs no wait.
  bool written() const { return in_flight_.written(); }
  // Waits for the save in flight and commits it, then deletes all but the newest
  // keep_last committed checkpoints and what killed saves left (rank 0). Collective;
  // nothing happens when no save is in flight.
  void commit();

 private:
  std::string dir_;
  int64_t keep_last_;
  nlohmann::json model_flags_;
  checkpoint::AsyncSave in_flight_;
  std::string in_flight_path_;  // the save in flight's directory and global bytes, for the log
  int64_t in_flight_bytes_ = 0;
};

// The checkpoint --resume names: "latest" is the newest committed step_* under
// checkpoint_dir ("" when there is none yet: a fresh start), anything else a path.
std::string resume_path(const std::string& resume, const std::string& checkpoint_dir);

// For a run that starts fresh: ValueError (on every rank alike, naming `flag`) when
// checkpoint_dir already holds committed checkpoints of an earlier run. --keep-last keeps
// the newest steps, so this run's checkpoints would be deleted in favour of those, and
// --resume latest would go back to them.
void check_no_earlier_checkpoints(const std::string& checkpoint_dir, std::string_view flag);

// After resuming at `step`: the committed checkpoints under checkpoint_dir of later steps
// belong to another line of training (the one rolled back from, or another run's). Each is
// renamed <name>.abandoned-at-<step>, with a line saying so, so that --resume latest and
// --keep-last follow this run and nothing is deleted. Rank 0 only; it never throws (a rename
// that fails is named, and that checkpoint stays).
void set_aside_later_checkpoints(const std::string& checkpoint_dir, int64_t step);

// Loads a checkpoint into the model's parameters (in place: the leaves stay the same
// objects) and the optimizer, and returns the position. Collective. `extra` is checked
// whole first (every field of its type and in its range, the model flags it records equal
// to `model_flags`): one ValueError line naming the field or the flags, before any tensor
// is read.
RunPosition load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                            const nlohmann::json& model_flags);

}  // namespace dtr::train
