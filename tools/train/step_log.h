// The train program's step log, written by rank 0. OUT/metrics.jsonl gets a line per step:
// step, loss, grad_norm, lr, ms, tokens_per_s, mfu (null without a known GPU peak), every
// rank's peak_bytes, rank 0's comm in the step (tools/trace/comm_accounting.h) and val_loss
// when computed; flushed, so a killed run keeps its lines. A resumed run keeps the lines up
// to its checkpoint's step and appends. stdout gets llm.c's progress line every --log-every
// steps, at the run's first and last step, with each validation loss and at least every 5 s:
//   step 3/6 | loss 5.5694 | val 5.5886 | grad norm 2.207 | lr 1.18e-04 | 23 ms/step |
//   5647 tokens/s | comm 73% | peak 9.8 MiB/rank | ETA 0s          (one line; "| MFU" on GPUs)
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "tools/trace/comm_accounting.h"
#include "tools/train/train_config.h"

namespace dtr::train {

// One step's figures.
struct StepRecord {
  int64_t step = 0;  // 1-based
  double loss = 0, grad_norm = 0, lr = 0, ms = 0;
  std::optional<double> val_loss;
};

// What turns step times into tokens/s and MFU.
struct Throughput {
  double tokens_per_step = 0;  // global: --batch-size x --seq-len
  int64_t world = 1;
  double flops_per_token = 0;         // tools/train/mfu.h
  std::optional<double> peak_tflops;  // the GPU's dense peak; nullopt (CPU ranks, a GPU not in the table): no MFU
};

// The run's, for a model of `parameters` parameters on `world` ranks of `device`.
Throughput run_throughput(const TrainConfig& config, const Device& device, int64_t world, int64_t parameters);

class StepLog {
 public:
  // Opens OUT/metrics.jsonl: anew, or for a run resumed from a checkpoint (`resumed_from`
  // not empty) after `first_step` steps, keeping its lines up to that step. The ETA counts
  // from here.
  StepLog(const TrainConfig& config, const Throughput& throughput, const std::string& resumed_from, int64_t first_step);

  // Step `record`'s line, with every rank's peak memory and rank 0's communication in the
  // step, and its progress line when one is due.
  void write(const StepRecord& record, const std::vector<double>& peak_bytes, const trace::StepComm& comm);

 private:
  using Clock = std::chrono::steady_clock;

  const TrainConfig& config_;
  Throughput throughput_;
  int64_t first_step_;
  std::ofstream metrics_;
  Clock::time_point start_, last_line_;
};

}  // namespace dtr::train
