// One train run per output directory. Rank 0 holds an advisory lock (flock) on <dir>/.lock
// of --out and of the checkpoint directory while the run lives, so a second run given the
// same directory is refused at its start, instead of writing its metrics over the first's,
// mixing their checkpoints and deleting each other's saves. The kernel drops the lock when
// the process ends, however it ends: a killed run leaves nothing to clean up (its lock file
// stays, unlocked), and dtrrun's restarts take the lock again. The file holds the holder's
// pid, for the message.
#pragma once

#include <vector>

#include "collectives/process_group.h"
#include "core/file_descriptor.h"
#include "tools/train/train_config.h"

namespace dtr::train {

class RunLock {
 public:
  // Locks the run's directories (prepare_output_dirs has made them). Collective over
  // `group`: when another run holds one, or its lock file cannot be made, every rank throws
  // the same ValueError line naming the flag, the directory and the other run's pid.
  RunLock(const TrainConfig& config, ProcessGroup& group);

 private:
  std::vector<FileDescriptor> held_;
};

}  // namespace dtr::train
