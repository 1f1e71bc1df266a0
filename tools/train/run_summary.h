// The end of a train run, on rank 0 once every rank's figures are gathered: where the trace
// went (--trace), a line when the run was interrupted or diverged, the monitoring table
// (tools/train/train_report.h), OUT/loss.svg (train and validation loss by step) and
// OUT/summary.json (steps, interrupted, diverged, train_s, tokens_per_s, mfu, resumed_from,
// first_loss, final_loss, final_val_loss, every rank's figures), then one line naming the
// files. A diverged step's non-finite values are JSON strings ("nan", "inf", "-inf").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tools/train/step_log.h"
#include "tools/train/train_config.h"
#include "tools/train/train_report.h"

namespace dtr::train {

// How the run ended.
struct RunOutcome {
  int64_t steps = 0;                     // the steps done, those before a resume included
  int64_t steps_run = 0;                 // this run's steps
  double train_s = 0;                    // their time
  bool interrupted = false;              // stopped by SIGINT or SIGTERM (on some rank)
  std::optional<StepRecord> diverged;    // the step whose loss or gradient norm was not finite
  std::string resumed_from;              // the checkpoint the run resumed from, or ""
  std::string merged_trace;              // the merged trace's path, or "" (no --trace)
  std::optional<uint64_t> state_digest;  // --deterministic: state_digest.h's, after the last step
};

// Prints and writes the summary of a run that took `records` steps (rank 0).
void write_summary(const TrainConfig& config, const Throughput& throughput, const std::vector<StepRecord>& records,
                   const RunOutcome& outcome, const std::vector<RankFigures>& ranks);

}  // namespace dtr::train
