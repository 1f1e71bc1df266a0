// What the train program's end-to-end tests share: the runfiles paths of train and dtrrun,
// the tiny model they train, a shell command run with its output captured, fresh output
// directories, a run's losses from its metrics.jsonl, and loss comparisons.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace dtr::testing {

// Runfiles paths (a test runs in its workspace's runfiles root).
inline const std::string kDtrrun = "tools/launcher/dtrrun";
inline const std::string kTrain = "tools/train/train";
// The tiny model the comparisons train: 12 sequences split over 1, 2, 3 or 4 ranks.
inline const std::string kTinyTrainFlags =
    "--dim 32 --layers 2 --heads 2 --seq-len 16 --batch-size 12 --steps 10 --eval-every 5 --eval-batches 1 "
    "--log-every 5 --warmup 2";

std::string read_file(const std::filesystem::path& path);

struct CommandResult {
  int exit_code;       // the shell's: the code, or 128 + the signal
  std::string output;  // stdout and stderr
};

// Runs `command` through the shell (stdin /dev/null), its output captured in `log`.
CommandResult run_command(const std::string& command, const std::filesystem::path& log);

// Each line's loss; every line must list the memory of `ranks` ranks (a Catch2 CHECK).
std::vector<double> losses_in(const std::filesystem::path& metrics, size_t ranks);

// An empty directory $TEST_TMPDIR/name (or under /tmp).
std::filesystem::path fresh_dir(const std::string& name);

// A train run with `flags` (ranks 0: one process without dtrrun, else dtrrun with that
// many) in fresh_dir(name), its output in name/out; REQUIREs that it succeeded.
struct TrainRun {
  CommandResult result;
  std::filesystem::path out;
};
TrainRun run_train(const std::string& name, int ranks, const std::string& flags);

// run_train's losses, a step each.
std::vector<double> train_losses(const std::string& name, int ranks, const std::string& flags);

// Step by step within a relative `tolerance` (Catch2 CHECKs naming the step).
void check_same_losses(const std::vector<double>& got, const std::vector<double>& expected, double tolerance);

}  // namespace dtr::testing
