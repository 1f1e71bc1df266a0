// train_bench: the train program end to end (tools/train/train under dtrrun, each run its own
// launch, one thread per rank) on the reference causal LM, against PyTorch 2.15 training the
// same model: --parallel none (1 rank only), ddp and fsdp on each rank count, fsdp with
// --mixed-precision (bf16 parameters, float32 reduction) on 2 ranks, tensor parallelism
// (--tp N, with and without --sequence-parallel) from 2 ranks up where N divides the 4
// heads, FSDP x TP (--parallel fsdp --tp 2: dp N/2 x tp 2) on an even 4 ranks and up, and
// each of none (1 rank), ddp and fsdp again with --deterministic, and tensor parallelism (none
// on 1 rank, --tp N where N divides the heads) with --deterministic --feature-blocks 4 (a
// note each: its step time and the bytes through a rank, nccl-tests' bus bytes, against the
// default's in the same run). One row per run: the median ms/step over the steps after the
// warm-up (from metrics.jsonl) and their range, tokens/s at that median, the share of the
// run the compute thread spent waiting on collectives (exposed_comm_s / train_s, every step
// included: tools/trace/comm_accounting.h), the peak memory (the largest of any rank), and
// PyTorch's tokens/s with dtr's over it.
//
//   bazel run //tools/bench:train_bench [-- --ranks 1,2,4 --steps 12 --warmup 2 --python PATH]
//
// PyTorch's side is tools/bench/peers/fsdp_peer.py under torch.distributed.run (as fsdp_bench runs
// it: fully_shard on each block and the root, DDP; --mixed-precision for the bf16 row) and
// tools/bench/peers/tp_peer.py (parallelize_module with Megatron's plan on the same model
// written with separate q, k and v projections; its sequence-parallel plan for tp+sp; with
// --dp, fully_shard on mesh["dp"] after it for fsdp+tp); its columns show '-' when torch is
// missing. Every run trains on a global batch of 8 sequences per rank: the ranks of a
// tensor-parallel group share theirs. Every run is checked before its figures are used:
// exit 0, every step done on every rank, every loss finite. Reference configuration
// (fsdp_peer.py's model): vocab 4096, dim 256, 4 layers, 4 heads, seq 128, learned
// positions, final LayerNorm, untied output with bias; 8 sequences per rank; AdamW, float32.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/temp_path.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/peer.h"
#include "tools/command_line.h"
#include "tools/tool_main.h"

namespace {

using namespace dtr;
namespace fs = std::filesystem;

constexpr int64_t kBatchPerRank = 8, kSeq = 128;

// float32 throughout, or --mixed-precision (bf16 parameters and compute, float32 reduction).
enum class Precision : uint8_t { kFloat32, kMixed };

// One run of the train program: what it is, and what it measured.
struct Run {
  int ranks = 1;
  std::string parallel;  // fsdp | ddp | none
  Precision precision = Precision::kFloat32;
  int tp = 1;  // --tp: all the ranks (--parallel none), or 2 under fsdp (dp x tp)
  bool sequence_parallel = false;
  bool deterministic = false;  // --deterministic (layout-invariant reductions)
  int64_t feature_blocks = 1;  // its --feature-blocks (tensor parallelism's invariance)
  bench::TrainRun measured;
  double tokens_per_s = 0;  // at the median ms/step
  std::optional<double> torch_tokens_per_s;

  std::string mode() const {
    if (tp > 1 && parallel != "none") return parallel + "+tp";
    const std::string blocks = feature_blocks > 1 ? fmt::format("-F{}", feature_blocks) : "";
    if (tp > 1) return deterministic ? "tp+det" + blocks : sequence_parallel ? "tp+sp" : "tp";
    if (deterministic) return parallel + "+det" + blocks;
    return precision == Precision::kMixed ? parallel + "+mp" : parallel;
  }
};

// Trains `run` for `steps` steps in `dir`, checks the result, and fills in its figures; the
// median and range are over the steps after the first `warmup`.
void train(Run& run, const std::string& dtrrun, const std::string& program, int64_t steps, int64_t warmup,
           const fs::path& dir) {
  const std::string flags = fmt::format(
      "{} --seq-len {} --parallel {}{}{}{} --batch-size {}", bench::kReferenceTrainFlags, kSeq, run.parallel,
      run.precision == Precision::kMixed ? " --mixed-precision" : "",
      run.deterministic ? fmt::format(" --deterministic --feature-blocks {}", run.feature_blocks) : "",
      run.tp > 1 ? fmt::format(" --tp {}{}", run.tp, run.sequence_parallel ? " --sequence-parallel" : "") : "",
      kBatchPerRank * run.ranks);
  run.measured = bench::run_train(dtrrun, program, run.ranks, flags, steps, warmup, dir,
                                  fmt::format("{} ranks, {}", run.ranks, run.mode()));
  run.tokens_per_s = static_cast<double>(kBatchPerRank * run.ranks * kSeq) / (run.measured.median_ms / 1e3);
}

// PyTorch's tokens/s at `ranks` ranks by mode (float32: fsdp and ddp; mixed: fsdp+mp), from
// fsdp_peer.py; empty, with `note` saying why, when it gave no figures.
std::map<std::string, double> torch_figures(const std::string& python, int ranks, int64_t steps, int64_t warmup,
                                            Precision precision, std::string& note) {
  const std::string peer = bench::command_output(fmt::format(
      "{} -m torch.distributed.run --standalone --nproc_per_node {} tools/bench/peers/fsdp_peer.py {} {}{}",
      bench::shell_quote(python), ranks, steps, warmup, precision == Precision::kMixed ? " --mixed-precision" : ""));
  double fsdp_ms = 0, fsdp_tps = 0, ddp_ms = 0, ddp_tps = 0;
  if (precision == Precision::kMixed) {
    const size_t at = peer.find("torch fsdp_mp ");
    if (at != std::string::npos && std::sscanf(peer.c_str() + at, "torch fsdp_mp %lf %lf", &fsdp_ms, &fsdp_tps) == 2) {
      return {{"fsdp+mp", fsdp_tps}};
    }
  } else {
    const size_t at = peer.find("torch fsdp ");
    if (at != std::string::npos &&
        std::sscanf(peer.c_str() + at, "torch fsdp %lf %lf ddp %lf %lf", &fsdp_ms, &fsdp_tps, &ddp_ms, &ddp_tps) == 4) {
      return {{"fsdp", fsdp_tps}, {"ddp", ddp_tps}};
    }
  }
  note = fmt::format("the PyTorch peer gave no figures; its output ends\n{}", bench::last_lines(peer, 8));
  return {};
}

// PyTorch's tensor-parallel tokens/s at `ranks` ranks ("tp" or "tp+sp"; with dp > 1
// "fsdp+tp", dp x ranks/dp), from tp_peer.py; empty, with `note` saying why, when it gave none.
std::map<std::string, double> torch_tp_figures(const std::string& python, int ranks, int dp, int64_t steps,
                                               int64_t warmup, bool sequence_parallel, std::string& note) {
  const std::string peer = bench::command_output(fmt::format(
      "{} -m torch.distributed.run --standalone --nproc_per_node {} tools/bench/peers/tp_peer.py {} {}{} --dp {}",
      bench::shell_quote(python), ranks, steps, warmup, sequence_parallel ? " --sequence-parallel" : "", dp));
  const std::string name = fmt::format("{}{}", dp > 1 ? "fsdp_" : "", sequence_parallel ? "tp_sp" : "tp");
  const std::string key = fmt::format("torch {} ", name);
  double ms = 0, tps = 0;
  const size_t at = peer.find(key);
  if (at != std::string::npos && std::sscanf(peer.c_str() + at + key.size(), "%lf %lf", &ms, &tps) == 2) {
    return {{dp > 1 ? "fsdp+tp" : sequence_parallel ? "tp+sp" : "tp", tps}};
  }
  note =
      fmt::format("the PyTorch tensor-parallel peer gave no figures; its output ends\n{}", bench::last_lines(peer, 8));
  return {};
}

void print_row(const Run& r) {
  const std::string torch = r.torch_tokens_per_s ? fmt::format("{:.0f}", *r.torch_tokens_per_s) : "-";
  const std::string ratio = r.torch_tokens_per_s ? fmt::format("{:.2f}", r.tokens_per_s / *r.torch_tokens_per_s) : "-";
  fmt::print("{:>5} | {:<11} | {:>8.1f} | {:>13} | {:>8.0f} | {:>6.1f} | {:>8.1f} | {:>12} | {:>9}\n", r.ranks,
             r.mode(), r.measured.median_ms, fmt::format("{:.0f}-{:.0f}", r.measured.min_ms, r.measured.max_ms),
             r.tokens_per_s, 100 * r.measured.comm_share, r.measured.peak_bytes / (1024.0 * 1024.0), torch, ratio);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "The train program (dtrrun, fsdp / ddp / none / tp / fsdp+tp) against PyTorch on the reference causal LM."};
  std::vector<int> ranks = {1, 2, 4};
  std::string python = bench::default_peer_python();
  int64_t steps = 12, warmup = 2;
  app.add_option("--ranks", ranks, "rank counts, comma-separated (each run its own launch)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--steps", steps, "steps per run, warm-up included")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "first steps left out of ms/step")->check(CLI::NonNegativeNumber);
  app.add_option("--python", python, "the Python that runs the PyTorch peer");
  if (const std::optional<int> exit_code = dtr::parse_command_line("train_bench", app, argc, argv)) return *exit_code;
  return tool_main("train_bench", [&] {
    DTR_CHECK(steps > warmup, ValueError, "--steps {} must exceed --warmup {}", steps, warmup);
    const std::string dtrrun = bench::find_built_program("tools/launcher/dtrrun", "//tools/bench:train_bench");
    const std::string program = bench::find_built_program("tools/train/train", "//tools/bench:train_bench");
    bench::enter_workspace();  // the peer script is read from the workspace
    const std::string torch_at = bench::torch_version(python);
    // Removed, with every run's output, however this ends.
    const TempPath scratch(fs::temp_directory_path() / fmt::format("train_bench.{}", ::getpid()));

    fmt::print(
        "the train program under dtrrun, 1 thread per rank ({} hardware threads), against {} (fsdp_peer.py, "
        "tp_peer.py)\n",
        std::thread::hardware_concurrency(), torch_at.empty() ? "PyTorch (missing)" : "PyTorch " + torch_at);
    fmt::print(
        "causal LM: vocab 4096, dim 256, 4 layers, 4 heads, seq {}, learned positions, final norm, untied output; {} "
        "sequences per rank, AdamW, float32 (fsdp+mp: bf16 parameters, float32 reduction)\n",
        kSeq, kBatchPerRank);
    fmt::print(
        "ms/step: median of steps {}..{} (range: their min-max); comm %: exposed_comm_s / train_s over all {} steps; "
        "comm and "
        "peak: the largest of any rank\n",
        warmup + 1, steps, steps);
    fmt::print("{:>5} | {:<11} | {:>8} | {:>13} | {:>8} | {:>6} | {:>8} | {:>12} | {:>9}\n", "ranks", "mode", "ms/step",
               "range ms", "tokens/s", "comm %", "peak MiB", "torch tok/s", "dtr/torch");
    std::fflush(stdout);
    std::vector<std::string> notes;
    if (torch_at.empty()) {
      notes.push_back(
          fmt::format("torch missing ({} cannot import it): pip install torch==2.15.0, or pass --python", python));
    }
    for (int n : ranks) {
      std::vector<Run> runs;
      const auto run_of = [n](const std::string& parallel) {
        Run r;
        r.ranks = n;
        r.parallel = parallel;
        return r;
      };
      if (n == 1) runs.push_back(run_of("none"));
      runs.push_back(run_of("ddp"));
      runs.push_back(run_of("fsdp"));
      // --deterministic (8 sequences per rank: one node of its tree each, on any rank count)
      for (const char* parallel : {"none", "ddp", "fsdp"}) {
        if (n == 1 || std::string(parallel) != "none") {
          runs.push_back(run_of(parallel));
          runs.back().deterministic = true;
        }
      }
      if (n == 2) {
        runs.push_back(run_of("fsdp"));
        runs.back().precision = Precision::kMixed;
      }
      if (n >= 2 && bench::kReferenceHeads % n != 0) {
        notes.push_back(fmt::format("{} ranks: no tp rows (the {} attention heads do not split over {})", n,
                                    bench::kReferenceHeads, n));
      }
      for (bool sp : {false, true}) {
        if (n < 2 || bench::kReferenceHeads % n != 0) continue;
        runs.push_back(run_of("none"));
        runs.back().tp = n;
        runs.back().sequence_parallel = sp;
      }
      if (n >= 4 && n % 2 == 0) {
        runs.push_back(run_of("fsdp"));
        runs.back().tp = 2;
      }
      // --deterministic with feature blocks for tensor parallelism (4: tp 2 and 4 each hold a
      // power of two of them), on one rank and under --tp N.
      if (n == 1 || bench::kReferenceHeads % n == 0) {
        runs.push_back(run_of("none"));
        runs.back().tp = n;
        runs.back().deterministic = true;
        runs.back().feature_blocks = bench::kReferenceHeads;
      }
      for (Run& r : runs) {
        train(r, dtrrun, program, steps, warmup, scratch.path() / fmt::format("{}_{}", n, r.mode()));
      }
      // PyTorch's figures, after dtr's, on the same machine.
      std::map<std::string, double> torch;
      for (Precision p : {Precision::kFloat32, Precision::kMixed}) {
        if (torch_at.empty() || (p == Precision::kMixed && n != 2)) continue;
        std::string note;
        torch.merge(torch_figures(python, n, steps - warmup, warmup, p, note));
        if (!note.empty()) {
          notes.push_back(fmt::format("{} ranks{}: {}", n, p == Precision::kMixed ? " (mixed precision)" : "", note));
        }
      }
      for (Run& r : runs) {
        if (torch_at.empty() || r.tp == 1 || r.deterministic) continue;  // PyTorch has no such mode
        std::string note;
        torch.merge(torch_tp_figures(python, n, n / r.tp, steps - warmup, warmup, r.sequence_parallel, note));
        if (!note.empty()) notes.push_back(fmt::format("{} ranks ({}): {}", n, r.mode(), note));
      }
      for (Run& r : runs) {
        if (auto it = torch.find(r.mode()); it != torch.end()) r.torch_tokens_per_s = it->second;
        print_row(r);
      }
      for (const Run& det : runs) {  // each --deterministic row against its default one, same run
        if (!det.deterministic) continue;
        for (const Run& base : runs) {
          if (base.deterministic || base.parallel != det.parallel || base.tp != det.tp || base.sequence_parallel ||
              base.precision != Precision::kFloat32) {
            continue;
          }
          notes.push_back(fmt::format(
              "{} ranks, {}: --deterministic{} costs {:+.1f}% step time ({:.1f} against {:.1f} ms), moves {:.3f}x "
              "the bytes per step through a rank ({:.2f} against {:.2f} MiB; nccl-tests' bus bytes)",
              n, base.mode(), det.feature_blocks > 1 ? fmt::format(" --feature-blocks {}", det.feature_blocks) : "",
              100 * (det.measured.median_ms / base.measured.median_ms - 1), det.measured.median_ms,
              base.measured.median_ms,
              base.measured.comm_bytes > 0 ? det.measured.comm_bytes / base.measured.comm_bytes : 1.0,
              det.measured.comm_bytes / (1024.0 * 1024.0), base.measured.comm_bytes / (1024.0 * 1024.0)));
        }
      }
    }
    for (const std::string& note : notes) fmt::print("{}\n", note);
    return 0;
  });
}
