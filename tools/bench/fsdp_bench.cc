// fsdp_bench: fully_shard against the DDP baseline (nn::replicate: Replicate parameters,
// gradients all-reduced in 25 MB buckets as they become ready) on the reference causal LM, for each
// rank count in one run: per rank, the bytes of parameters, gradients and optimizer state
// (and FSDP's divided by the baseline's, next to the ideal 1/N), the peak memory, ms/step,
// tokens/s, and the time per step the compute thread spent waiting on collectives
// (Work::wait: blocked, or running a collective inline). Each rank count is its own launch of this program's ranks (one
// thread each).
//
//   bazel run -c opt //tools/bench:fsdp_bench [-- --ranks 1,2,4 --steps 5 --warmup 2 --python PATH]
//
// After each rank count, PyTorch 2.15's fully_shard and DDP train the same model on gloo
// in the same run (tools/bench/peers/fsdp_peer.py under torch.distributed.run; skipped when torch
// is missing), and the ratios of dtr's tokens/s to theirs are printed.
// The reference model (reference_lm.h), AdamW; FSDP shards each block and the root.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "core/temp_path.h"
#include "core/units.h"
#include "nn/fully_shard.h"
#include "nn/replicate.h"
#include "optim/adam.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/peer.h"
#include "tools/bench/reference_lm.h"
#include "tools/command_line.h"
#include "tools/launcher/self_launch.h"
#include "tools/tool_main.h"
#include "tools/train/train_report.h"

namespace {

using namespace dtr;
using Clock = std::chrono::steady_clock;

struct Figures {
  double param_bytes = 0, grad_bytes = 0, optim_bytes = 0, peak_bytes = 0, ms_per_step = 0;
  double wait_ms_per_step = 0;  // in Work::wait: the compute thread waiting on collectives
};

// How run() distributes the model: replicated (DDP) or fully sharded (FSDP2).
enum class Sharding : uint8_t { kReplicate, kFullyShard };

// Trains `steps` timed steps after `warmup`; the largest figure of any rank.
Figures run(const DeviceMesh& mesh, Sharding sharding, int64_t steps, int64_t warmup) {
  bench::ReferenceLM lm(mesh);
  nn::Transformer& model = lm.model;
  if (sharding == Sharding::kFullyShard) {
    for (auto& [name, m] : model.named_modules()) {
      if (m->type_name() == "TransformerBlock") nn::fully_shard(*m, mesh);
    }
    nn::fully_shard(model, mesh);
  } else {
    nn::replicate(model, mesh);
  }
  optim::AdamW opt({{.params = model.parameters(), .lr = 3e-4, .weight_decay = 0.1}});
  std::vector<double> times;
  Figures f;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    if (step == warmup) {
      reset_peak_memory_stats(kCPU);
      collective_counter().reset();
    }
    const auto t0 = Clock::now();
    opt.zero_grad();
    const DTensor loss = lm.loss();
    loss.backward();
    if (step + 1 == warmup + steps) {  // the gradients, before the step drops nothing
      f.grad_bytes = train::gradient_bytes(model.parameters());
    }
    opt.step();
    if (step + 1 == warmup + steps)
      f.wait_ms_per_step = static_cast<double>(collective_counter().wait_ns()) / 1e6 / steps;
    loss.item();  // a collective: every rank ends the step together (not counted as waiting)
    if (step >= warmup) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  f.param_bytes = train::parameter_bytes(model.parameters());
  f.optim_bytes = train::optimizer_state_bytes(opt);
  f.peak_bytes = static_cast<double>(memory_stats(kCPU).peak_bytes);
  f.ms_per_step = bench::median(times);
  // The largest of every rank's figures.
  Tensor all = Tensor::from_vector<double>(
      {f.param_bytes, f.grad_bytes, f.optim_bytes, f.peak_bytes, f.ms_per_step, f.wait_ms_per_step});
  default_group()->all_reduce(all, ReduceOp::kMax).wait();
  const double* v = all.data_ptr<double>();
  return {v[0], v[1], v[2], v[3], v[4], v[5]};
}

// Where rank 0 writes dtr's FSDP tokens/s for the launching process.
constexpr const char* kResultFileEnv = "DTR_FSDP_BENCH_RESULT";

double read_result(const std::string& path) {
  double tokens_per_s = 0;
  std::ifstream in(path);
  DTR_CHECK(in >> tokens_per_s, ValueError, "fsdp_bench: rank 0 left no result in {}", path);
  return tokens_per_s;
}

void rank_main(int64_t steps, int64_t warmup) {
  init_process_group(Backend::kGloo);
  set_num_threads(1);
  const int world = default_group()->size();
  const DeviceMesh mesh = init_device_mesh(kCPU, {world}, {"dp"});
  const Figures base = run(mesh, Sharding::kReplicate, steps, warmup);
  const Figures fsdp = run(mesh, Sharding::kFullyShard, steps, warmup);
  if (default_group()->rank() == 0) {
    const double tokens = static_cast<double>(bench::ReferenceLM::kBatchPerRank * world * bench::ReferenceLM::kSeq);
    if (const char* path = std::getenv(kResultFileEnv)) {
      std::ofstream(path) << tokens / (fsdp.ms_per_step / 1e3) << "\n";
    }
    const double state_base = base.param_bytes + base.grad_bytes + base.optim_bytes;
    for (const auto& [name, f] : {std::pair{"DDP", base}, std::pair{"FSDP", fsdp}}) {
      const double state = f.param_bytes + f.grad_bytes + f.optim_bytes;
      fmt::print(
          "{:>5} | {:<11} | {:>10.2f} | {:>9.2f} | {:>9.2f} | {:>10.2f} | {:>6.3f} (1/N {:.3f}) | {:>9.1f} | "
          "{:>8.1f} | {:>8.1f} | {:>7.1f}\n",
          world, name, mib(f.param_bytes), mib(f.grad_bytes), mib(f.optim_bytes), mib(state), state / state_base,
          1.0 / world, mib(f.peak_bytes), f.ms_per_step, tokens / (f.ms_per_step / 1e3), f.wait_ms_per_step);
    }
  }
  destroy_process_group();
}

std::vector<int> parse_ranks(const std::string& list) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, comma - at);
    char* end = nullptr;
    const long n = std::strtol(item.c_str(), &end, 10);
    DTR_CHECK(!item.empty() && *end == '\0' && n >= 1 && n <= 64, ValueError,
              "fsdp_bench: --ranks '{}': each entry must be a rank count in 1..64", list);
    out.push_back(static_cast<int>(n));
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fully_shard against the DDP baseline: memory per rank and tokens/s."};
  std::string ranks = "1,2,4", python = bench::default_peer_python();
  int64_t steps = 5, warmup = 2;
  app.add_option("--ranks", ranks, "rank counts, comma-separated (each one launch)");
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::PositiveNumber);
  app.add_option("--python", python, "the Python that runs the PyTorch peer");
  if (const std::optional<int> exit_code = dtr::parse_command_line("fsdp_bench", app, argc, argv)) return *exit_code;
  return tool_main("fsdp_bench", [&] {
    if (launcher::is_rank_process()) {
      rank_main(steps, warmup);
      return 0;
    }
    const std::vector<int> counts = parse_ranks(ranks);
    fmt::print("{}, AdamW, 1 thread per rank; medians of {} steps after {} warm-up; the largest figure of any rank\n",
               bench::ReferenceLM::describe(), steps, warmup);
    fmt::print("{:>5} | {:<11} | {:>10} | {:>9} | {:>9} | {:>10} | {:>18} | {:>9} | {:>8} | {:>8} | {:>7}\n", "ranks",
               "mode", "params MiB", "grads MiB", "optim MiB", "total MiB", "total / DDP", "peak MiB", "ms/step",
               "tokens/s", "wait ms");
    std::fflush(stdout);
    bench::enter_workspace();  // the peer script is read from the workspace
    // Rank 0 of each launch leaves dtr's FSDP tokens/s here, for the ratios to the peer's.
    const std::string result_file = fmt::format("/tmp/fsdp_bench.{}.result", ::getpid());
    const TempPath result_owner(result_file);  // removed however this ends
    ::setenv(kResultFileEnv, result_file.c_str(), 1);
    for (int n : counts) {
      const launcher::SelfLaunchResult result = launcher::launch_self(n, std::span(argv, argc));
      if (result.exit_code != 0) {
        fmt::print(stderr, "fsdp_bench: {} ranks: {}\n", n, result.failure);
        return result.exit_code;
      }
      const std::string peer = bench::command_output(fmt::format(
          "{} -m torch.distributed.run --standalone --nproc_per_node {} tools/bench/peers/fsdp_peer.py {} {}", python,
          n, steps, warmup));
      const size_t at = peer.find("torch fsdp");
      double fsdp_ms = 0, fsdp_tps = 0, ddp_ms = 0, ddp_tps = 0;
      if (at == std::string::npos || std::sscanf(peer.c_str() + at, "torch fsdp %lf %lf ddp %lf %lf", &fsdp_ms,
                                                 &fsdp_tps, &ddp_ms, &ddp_tps) != 4) {
        fmt::print("{:>5} | PyTorch peer not run ({}): pip install torch==2.15.0, or pass --python\n", n,
                   peer.find("torch missing") != std::string::npos ? "torch missing" : "no figures");
        std::fflush(stdout);
        continue;
      }
      for (const auto& [name, ms, tps] :
           {std::tuple{"torch FSDP2", fsdp_ms, fsdp_tps}, {"torch DDP", ddp_ms, ddp_tps}}) {
        fmt::print("{:>5} | {:<11} | {:>10} | {:>9} | {:>9} | {:>10} | {:>18} | {:>9} | {:>8.1f} | {:>8.1f} | {:>7}\n",
                   n, name, "-", "-", "-", "-", "-", "-", ms, tps, "-");
      }
      const double dtr_tps = read_result(result_file);
      fmt::print("{:>5} | dtr FSDP / torch FSDP2 tokens/s: {:.2f}; dtr FSDP / torch DDP tokens/s: {:.2f}\n", n,
                 dtr_tps / fsdp_tps, dtr_tps / ddp_tps);
      std::fflush(stdout);
    }
    return 0;
  });
}
