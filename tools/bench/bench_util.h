// Kernel benchmark harness: a timer with warm-up and median-of-samples, and a suite of
// registered rows printed as one aligned table (the layout of nccl-tests and llm.c's).
//
// Every row is checked before it is timed: the case runs once, its check compares the
// result with an independent computation, and the row says "ok" or "WRONG" (a WRONG row is
// still timed and printed; the program exits non-zero). Each row is timed against a
// reference doing the same work in the same run (a memcpy of the same bytes moved, a
// library GEMM), their samples interleaved, so "% of ref" compares with the machine as it
// is, not a datasheet. A row's inputs are built only when it runs and freed after it.
//
// Training benchmarks (train_bench, ac_bench) run the train program under dtrrun instead:
// run_train launches one run, checks it (exit 0, every step on every rank, finite losses)
// and reads its figures from summary.json and metrics.jsonl.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace dtr::bench {

struct Timing {
  double median_us = 0;  // per call
  double min_us = 0;
  double max_us = 0;
  int64_t samples = 0;
};

struct TimingOptions {
  double min_seconds = 0.3;   // sample until this much time has passed...
  int64_t min_samples = 15;   // ...and at least this many samples are taken,
  int64_t max_samples = 200;  // or this many are.
  int64_t warmup = 2;
};

// The median of samples (the mean of the middle two for an even count); samples not empty.
double median(std::vector<double> samples);

// Times fn: warm-up calls, then samples of enough back-to-back calls to last >= 50 us each.
// Returns the per-call median and range over the samples.
Timing time_it(const std::function<void()>& fn, const TimingOptions& options = {});

// fn's and ref's timings from alternating samples, and ratio: the median over the pairs of
// adjacent samples of ref's per-call time over fn's.
struct PairTiming {
  Timing fn, ref;
  double ratio = 0;
};

// Times fn and ref as time_it does, alternating their samples, so that both see the same
// machine (other work on it comes and goes). Each pair's ratio cancels the drifts slower
// than a pair, so the median ratio is steadier than the ratio of the two medians. Pairs
// alternate which of the two goes first (fn then ref, ref then fn, ...), so that neither
// always finds the caches and clocks the other left.
PairTiming time_pair(const std::function<void()>& fn, const std::function<void()>& ref,
                     const TimingOptions& options = {});

// The same work done by a trusted implementation, timed beside the row.
struct Reference {
  std::string name;
  std::function<void()> run;
};

// A memcpy that moves `bytes_moved` bytes (copies half of them: each byte is read and
// written), split across the OpenMP threads like the kernels it is compared with.
Reference memcpy_reference(double bytes_moved);

// What one row runs. bytes is what the op reads plus writes (the GB/s column); flops, when
// > 0, gives a GFLOP/s column instead. check returns "" when the result (after one run) is
// right, else what is wrong.
struct Case {
  double bytes = 0;
  double flops = 0;
  std::function<void()> run;
  std::function<std::string()> check;
  Reference reference;
};

// A registered row: its label (op, dtype, shape: what --filter matches) and how to build it.
struct Row {
  std::string op;
  std::string dtype;
  std::string shape;
  std::function<Case()> make;
};

// A row's in-cache twin may move at most this many bytes to give its in-cache time: with
// inputs and outputs in the caches (a row of them in L2), its time is its arithmetic (and
// its per-call overhead), not its memory traffic.
inline constexpr double kInCacheMaxBytes = 4 << 20;

class Suite {
 public:
  void add(Row row) { rows_.push_back(std::move(row)); }
  // Runs the rows whose "op dtype shape" contains filter, printing the table to os as rows
  // finish. Returns the number of rows whose check failed. in_cache holds suites of the
  // same rows in the same order built at smaller sizes, largest first: a row's twin is the
  // first of them that moves at most kInCacheMaxBytes, and the twin's time scaled to the
  // row's bytes is the row's in-cache time. A row whose in-cache time exceeds its memcpy
  // reference is compute-bound: it cannot beat the larger of the two.
  int run(const std::string& filter, const TimingOptions& timing, std::ostream& os,
          const std::vector<const Suite*>& in_cache = {}) const;

 private:
  std::vector<Row> rows_;
};

// Element of t at coords, as double (any dtype, any strides): for checks.
double element_at(const Tensor& t, std::span<const int64_t> coords);
// Checks actual against expected(coords) at a spread of sampled positions (always including
// the first and last element): "" when all are within atol + rtol * |expected|, else the first miss.
std::string check_sampled(const Tensor& actual, const std::function<double(std::span<const int64_t>)>& expected,
                          double atol, double rtol);

// The train flags of the reference configuration (fsdp_peer.py's model and optimizer:
// vocab 4096, dim 256, 4 layers, 4 heads, learned positions, final norm, untied output with
// bias, AdamW, float32, one thread per rank), without --seq-len, --parallel and
// --batch-size. train takes its vocabulary from the byte tokenizer (256) unless --vocab is
// larger; the tokens stay below 256, which changes no time. --grad-clip 0: the peer does not
// clip (train still computes the norm it logs).
inline constexpr const char* kReferenceTrainFlags =
    "--vocab 4096 --dim 256 --layers 4 --heads 4 --arch gpt --tie-embeddings false --tokenizer byte --lr 3e-4 "
    "--weight-decay 0.1 --warmup 0 --lr-schedule constant --grad-clip 0 --threads 1 --eval-every 0";

// kReferenceTrainFlags' --heads: a tensor-parallel size must divide it.
inline constexpr int64_t kReferenceHeads = 4;

// The last `n` lines of `text`, for a failure message.
std::string last_lines(const std::string& text, int n);

// The built program at `path` (workspace-relative, e.g. tools/train/train): from this
// binary's runfiles (a data dependency), else from bazel-bin. ValueError naming the places
// tried and `bench` (the target to build) when there is none.
std::string find_built_program(const std::string& path, const std::string& bench);

// What one checked train run measured.
struct TrainRun {
  double median_ms = 0, min_ms = 0, max_ms = 0;  // ms/step over the steps after the warm-up
  double comm_share = 0;                         // the largest exposed_comm_s / train_s of any rank
  double peak_bytes = 0;                         // the largest of any rank
  double comm_bytes = 0;  // rank 0's bytes through it in the last step's collectives (nccl-tests' bus bytes)
};

// Runs `dtrrun --nproc-per-node ranks program flags --steps steps ...` in `dir` (emptied
// first; output in dir/output.txt, the run's files in dir/out) and checks it: exit 0,
// summary.json and metrics.jsonl with `steps` steps of every rank, every loss finite. The
// median and range are over the steps after the first `warmup`. Error naming `what`, the
// command and the end of its output when a check fails.
TrainRun run_train(const std::string& dtrrun, const std::string& program, int ranks, const std::string& flags,
                   int64_t steps, int64_t warmup, const std::filesystem::path& dir, const std::string& what);

}  // namespace dtr::bench
