// overlap_bench: what FSDP's prefetch and resharding buy in hiding collectives behind
// compute, on the reference causal LM (reference_lm.h) with one thread per rank, and how much
// of a collective this machine and backend can hide at all.
//
//   bazel run -c opt //tools/bench:overlap_bench [-- --ranks 2 --steps 10 --warmup 3
//       --tracer-cycles 10 --pair-dim 768 --pair-mib 1,4,16,64 --pair-repeats 7]
//
// 1. FSDP settings, one row each: prefetch implicit (each group's pre-forward issues the
//    all-gather of the group that ran next in the last iteration; pre-backward that of the
//    one before), explicit 1 and 2 groups ahead (nn::set_prefetch_depth), and off (every
//    all-gather issued when its group runs), each with reshard_after_forward true (ZeRO-3)
//    and false (ZeRO-2). Every step is traced with trace::kCommCategories and accounted
//    (tools/trace/comm_accounting.h): ms/step; collective ms (their spans on the
//    communication thread); exposed ms (of those, the time the compute thread waited) and
//    its share of the step; the share of collective time hidden; exposed ms by phase; peak
//    memory. Medians over the timed steps of each rank, averaged over the ranks. Every row
//    trains the same steps from the same start: their losses must be bitwise equal (checked).
// 2. Tracer cost: steps of the first row with tracing off, recording kCommCategories (what
//    the train program does every step) and recording every category (its --trace steps),
//    interleaved step by step; each mode's median ms/step and the median over cycles of its
//    ratio to the untraced step of the same cycle. And one span's cost, off and recording.
// 3. Overlap ceiling: a D x D x D float32 matrix product alone, an all-gather of S MiB
//    (output) alone, and the all-gather issued just before the product and waited for after
//    it. hidden = (product + all-gather - together) / all-gather: the share of the
//    collective that ran behind the product, at each ratio of their times.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/trace.h"
#include "core/units.h"
#include "kernels/matmul.h"
#include "kernels/random.h"
#include "nn/fully_shard.h"
#include "optim/adam.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/reference_lm.h"
#include "tools/command_line.h"
#include "tools/launcher/self_launch.h"
#include "tools/tool_main.h"
#include "tools/trace/comm_accounting.h"
#include "tools/train/train_report.h"
#include "tools/train/train_trace.h"

namespace {

using namespace dtr;
using Clock = std::chrono::steady_clock;

constexpr double kGoalExposedShare = 0.20;  // with prefetch, at 2 ranks
constexpr int kImplicit = -1;               // Setting::prefetch: no explicit depth

struct Setting {
  int prefetch = kImplicit;  // explicit depth; 0: off
  bool reshard_after_forward = true;
  std::string name() const {
    const std::string p = prefetch == kImplicit ? "implicit"
                          : prefetch == 0       ? "off"
                                                : fmt::format("explicit {}", prefetch);
    return fmt::format("{:<10} | {:<7}", p, reshard_after_forward ? "true" : "false");
  }
};

// The phases of FSDP's collectives, as comm_accounting names them; the rest is "other".
constexpr std::array<const char*, 3> kPhases = {"forward all_gather", "backward all_gather", "reduce_scatter"};

// Per step: step ms, collective ms, exposed ms, exposed ms of each phase and of the rest.
constexpr size_t kStepFigures = 3 + kPhases.size() + 1;

// The mean over ranks of each rank's figures (a collective).
std::vector<double> mean_over_ranks(std::vector<double> figures) {
  Tensor t = Tensor::from_vector<double>(figures);
  default_group()->all_reduce(t).wait();
  const double* v = t.data_ptr<double>();
  for (size_t i = 0; i < figures.size(); ++i) figures[i] = v[i] / default_group()->size();
  return figures;
}

std::vector<double> step_figures(const trace::StepComm& c) {
  std::vector<double> f = {c.step_us / 1e3, c.time.total_us / 1e3, c.time.exposed_us / 1e3};
  double phases = 0;
  for (const char* phase : kPhases) {
    const auto it = c.by_phase.find(phase);
    f.push_back(it == c.by_phase.end() ? 0 : it->second.exposed_us / 1e3);
    phases += f.back();
  }
  f.push_back(f[2] - phases);
  return f;
}

// The model sharded per `s`: each block and the root, as the train program does.
void shard(nn::Transformer& model, const DeviceMesh& mesh, const Setting& s) {
  nn::FullyShardOptions options;
  options.reshard_after_forward = s.reshard_after_forward;
  std::vector<nn::FSDPModule*> blocks;
  for (auto& [name, m] : model.named_modules()) {
    if (m->type_name() == "TransformerBlock") blocks.push_back(&nn::fully_shard(*m, mesh, options));
  }
  options.reshard_after_forward.reset();  // the root keeps its parameters for backward
  nn::FSDPModule& root = nn::fully_shard(model, mesh, options);
  if (s.prefetch != kImplicit) nn::set_prefetch_depth(root, blocks, s.prefetch);
}

struct Row {
  std::vector<double> figures;  // kStepFigures medians, then peak MiB
  double last_loss = 0;
};

// One training step (zero_grad to the loss read on the host); its loss.
double train_step(bench::ReferenceLM& lm, optim::AdamW& opt) {
  opt.zero_grad();
  const DTensor loss = lm.loss();
  loss.backward();
  opt.step();
  return loss.item();
}

Row run_setting(const DeviceMesh& mesh, const Setting& s, train::StepTracer& tracer, int64_t& step_number,
                int64_t steps, int64_t warmup) {
  bench::ReferenceLM lm(mesh);
  shard(lm.model, mesh, s);
  optim::AdamW opt({{.params = lm.model.parameters(), .lr = 3e-4, .weight_decay = 0.1}});
  std::vector<std::vector<double>> samples(kStepFigures);
  Row row;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    if (step == warmup) reset_peak_memory_stats(kCPU);
    tracer.begin(++step_number);
    row.last_loss = train_step(lm, opt);
    const trace::StepComm comm = tracer.end();
    if (step < warmup) continue;
    const std::vector<double> f = step_figures(comm);
    for (size_t i = 0; i < kStepFigures; ++i) samples[i].push_back(f[i]);
  }
  for (auto& s : samples) row.figures.push_back(bench::median(s));
  row.figures.push_back(mib(static_cast<double>(memory_stats(kCPU).peak_bytes)));
  row.figures = mean_over_ranks(row.figures);
  return row;
}

// Table 1; returns whether every row's last loss equals the first's.
bool settings_table(const DeviceMesh& mesh, int64_t steps, int64_t warmup) {
  const bool print = default_group()->rank() == 0;
  if (print) {
    fmt::print("\n1. FSDP settings ({} timed steps after {} warm-up; medians, mean over ranks)\n", steps, warmup);
    fmt::print("{:<10} | {:<7} | {:>7} | {:>7} | {:>7} | {:>9} | {:>8} | {:>7} | {:>7} | {:>7} | {:>7} | {:>8}\n",
               "prefetch", "reshard", "ms/step", "comm ms", "exp. ms", "exposed %", "hidden %", "fwd AG", "bwd AG",
               "RS", "other", "peak MiB");
    fmt::print("{:<10} | {:<7} | {:>7} | {:>7} | {:>7} | {:>9} | {:>8} | {:>39} |\n", "", "", "", "", "", "of step",
               "of comm", "exposed ms by phase");
    std::fflush(stdout);
  }
  train::StepTracer tracer(*default_group(), std::nullopt, "");
  int64_t step_number = 0;
  std::optional<double> first_loss;
  double worst_prefetched = 0;
  std::string worst_name;
  bool same = true;
  for (bool reshard : {true, false}) {
    for (int prefetch : {kImplicit, 1, 2, 0}) {
      const Setting s{.prefetch = prefetch, .reshard_after_forward = reshard};
      const Row r = run_setting(mesh, s, tracer, step_number, steps, warmup);
      if (!first_loss) first_loss = r.last_loss;
      same = same && r.last_loss == *first_loss;
      const std::vector<double>& f = r.figures;
      const double exposed_share = f[2] / f[0], hidden_share = f[1] > 0 ? 1 - f[2] / f[1] : 0;
      if (prefetch != 0 && exposed_share >= worst_prefetched) {
        worst_prefetched = exposed_share;
        worst_name = s.name();
      }
      if (!print) continue;
      fmt::print(
          "{} | {:>7.1f} | {:>7.1f} | {:>7.1f} | {:>8.1f}% | {:>7.1f}% | {:>7.2f} | {:>7.2f} | {:>7.2f} | {:>7.2f} | "
          "{:>8.1f}{}\n",
          s.name(), f[0], f[1], f[2], 100 * exposed_share, 100 * hidden_share, f[3], f[4], f[5], f[6], f[7],
          r.last_loss == *first_loss
              ? ""
              : fmt::format("  WRONG: loss {} differs from the first row's {}", r.last_loss, *first_loss));
      std::fflush(stdout);
    }
  }
  if (print) {
    fmt::print(
        "goal: with prefetch, exposed communication under {:.0f}% of the step at 2 ranks: worst {:.1f}% ({}): {}\n",
        100 * kGoalExposedShare, 100 * worst_prefetched, worst_name,
        worst_prefetched < kGoalExposedShare ? "met" : "NOT met");
    fmt::print("check: every row's loss after its last step is bitwise the first row's: {}\n", same ? "ok" : "WRONG");
  }
  return same;
}

// Table 2 (the step part): cycles of an untraced, a kCommCategories and a fully traced step.
void tracer_cost_table(const DeviceMesh& mesh, int64_t cycles, int64_t warmup) {
  bench::ReferenceLM lm(mesh);
  shard(lm.model, mesh, {});
  optim::AdamW opt({{.params = lm.model.parameters(), .lr = 3e-4, .weight_decay = 0.1}});
  const std::array<trace::Categories, 3> kModes = {0, trace::kCommCategories, trace::kAllCategories};
  std::array<std::vector<double>, 3> ms, ratio;
  int64_t events = 0;
  for (int64_t cycle = 0; cycle < warmup + cycles; ++cycle) {
    std::array<double, 3> t{};
    for (size_t m = 0; m < kModes.size(); ++m) {
      const auto t0 = Clock::now();
      if (kModes[m] != 0) trace::start(kModes[m]);
      train_step(lm, opt);
      if (kModes[m] != 0) {
        const std::vector<trace::ThreadEvents> run = trace::stop();
        if (m == 2) {
          events = 0;
          for (const trace::ThreadEvents& th : run) events += static_cast<int64_t>(th.events.size());
        }
      }
      t[m] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
    if (cycle < warmup) continue;
    for (size_t m = 0; m < kModes.size(); ++m) {
      ms[m].push_back(t[m]);
      ratio[m].push_back(t[m] / t[0]);
    }
  }
  std::vector<double> f;
  for (size_t m = 0; m < kModes.size(); ++m) {
    f.push_back(bench::median(ms[m]));
    f.push_back(bench::median(ratio[m]));
  }
  f.push_back(static_cast<double>(events));
  f = mean_over_ranks(f);
  if (default_group()->rank() != 0) return;
  fmt::print("\n2. tracer cost: {} cycles of 3 steps (implicit prefetch, reshard), after {} warm-up\n", cycles, warmup);
  fmt::print("{:<26} | {:>7} | {:>12}\n", "tracing", "ms/step", "/ untraced");
  constexpr std::array<const char*, 3> kNames = {"off", "comm categories (train)", "every category (--trace)"};
  for (size_t m = 0; m < kModes.size(); ++m) {
    fmt::print("{:<26} | {:>7.1f} | {:>12.3f}\n", kNames[m], f[2 * m], f[2 * m + 1]);
  }
  fmt::print("(a fully traced step records {:.0f} spans per rank)\n", f.back());
  std::fflush(stdout);
}

// Table 3: the overlap ceiling.
void pair_table(const std::vector<double>& mib, int64_t dim, int64_t repeats) {
  ProcessGroup& pg = *default_group();
  const int world = pg.size();
  Tensor a = Tensor::empty({dim, dim}, kFloat32), b = Tensor::empty({dim, dim}, kFloat32);
  uniform_(a, -1, 1, 2);
  uniform_(b, -1, 1, 3);
  if (pg.rank() == 0) {
    fmt::print(
        "\n3. overlap ceiling: a {0}x{0}x{0} float32 matrix product beside an all-gather over {1} ranks "
        "(medians of {2}, mean over ranks)\n",
        dim, world, repeats);
    fmt::print("{:>9} | {:>9} | {:>10} | {:>8} | {:>11} | {:>10} | {:>8}\n", "AG MiB", "AG ms", "matmul ms", "AG / mm",
               "together ms", "exposed ms", "hidden %");
    std::fflush(stdout);
  }
  for (double m : mib) {
    const auto per_rank = std::max<int64_t>(1, static_cast<int64_t>(m * (1 << 20) / 4 / world));
    Tensor in = Tensor::empty({per_rank}, kFloat32), out = Tensor::empty({per_rank * world}, kFloat32);
    uniform_(in, -1, 1, 4);
    auto timed = [&](const std::function<void()>& fn) {
      pg.barrier().wait();
      const auto t0 = Clock::now();
      fn();
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    std::array<std::vector<double>, 3> t;
    for (int64_t r = 0; r < repeats + 1; ++r) {  // the first round warms up
      const double mm = timed([&] { matmul(a, b); });
      const double ag = timed([&] { pg.all_gather_into_tensor(out, in).wait(); });
      const double both = timed([&] {
        Work w = pg.all_gather_into_tensor(out, in);
        matmul(a, b);
        w.wait();
      });
      if (r == 0) continue;
      t[0].push_back(ag);
      t[1].push_back(mm);
      t[2].push_back(both);
    }
    const std::vector<double> f = mean_over_ranks({bench::median(t[0]), bench::median(t[1]), bench::median(t[2])});
    if (pg.rank() != 0) continue;
    const double hidden = std::clamp((f[0] + f[1] - f[2]) / f[0], 0.0, 1.0);
    fmt::print("{:>9.3f} | {:>9.3f} | {:>10.3f} | {:>8.2f} | {:>11.3f} | {:>10.3f} | {:>7.1f}%\n",
               static_cast<double>(per_rank * world * 4) / (1 << 20), f[0], f[1], f[0] / f[1], f[2], f[2] - f[1],
               100 * hidden);
    std::fflush(stdout);
  }
}

struct Options {
  int ranks = 2;
  int64_t steps = 10, warmup = 3, tracer_cycles = 10, pair_dim = 768, pair_repeats = 7;
  std::vector<double> pair_mib = {1, 4, 16, 64};
};

int rank_main(const Options& o) {
  init_process_group(Backend::kGloo);
  set_num_threads(1);
  const DeviceMesh mesh = init_device_mesh(kCPU, {default_group()->size()}, {"dp"});
  const bool same = settings_table(mesh, o.steps, o.warmup);
  tracer_cost_table(mesh, o.tracer_cycles, std::min<int64_t>(o.warmup, 2));
  pair_table(o.pair_mib, o.pair_dim, o.pair_repeats);
  destroy_process_group();
  return same ? 0 : 1;
}

// One span's cost, in ns: off, and recording (with the run's start and stop amortised).
void span_cost() {
  constexpr int kSpans = 1000;
  const bench::Timing off = bench::time_it([] {
    for (int i = 0; i < kSpans; ++i) trace::Span s("span", trace::Category::kOp);
  });
  const bench::Timing on = bench::time_it([] {
    trace::start(trace::kAllCategories);
    for (int i = 0; i < kSpans; ++i) trace::Span s("span", trace::Category::kOp);
    trace::stop();
  });
  fmt::print(
      "one span: {:.1f} ns with tracing off, {:.1f} ns recording (start and stop of a {}-span run "
      "included)\n",
      off.median_us * 1e3 / kSpans, on.median_us * 1e3 / kSpans, kSpans);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"FSDP's overlap of collectives with compute: prefetch and resharding, tracer cost, overlap ceiling."};
  Options o;
  app.add_option("--ranks", o.ranks, "ranks (processes, one thread each)")->check(CLI::Range(2, 64));
  app.add_option("--steps", o.steps, "timed steps per setting")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::PositiveNumber);
  app.add_option("--tracer-cycles", o.tracer_cycles, "timed cycles of the tracer-cost steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--pair-dim", o.pair_dim, "the overlap ceiling's matrix product size D")->check(CLI::Range(1, 8192));
  app.add_option("--pair-mib", o.pair_mib, "its all-gather sizes, MiB of output")
      ->delimiter(',')
      ->check(CLI::Range(1e-6, 4096.0));
  app.add_option("--pair-repeats", o.pair_repeats, "its timed rounds per size")->check(CLI::PositiveNumber);
  if (const std::optional<int> exit_code = dtr::parse_command_line("overlap_bench", app, argc, argv)) return *exit_code;
  return tool_main("overlap_bench", [&] {
    if (launcher::is_rank_process()) return rank_main(o);
    fmt::print("{}, FSDP (each block and the root), AdamW, Gloo, {} ranks x 1 thread\n", bench::ReferenceLM::describe(),
               o.ranks);
    span_cost();
    std::fflush(stdout);
    const launcher::SelfLaunchResult result = launcher::launch_self(o.ranks, std::span(argv, argc));
    if (result.exit_code != 0) fmt::print(stderr, "overlap_bench: {}\n", result.failure);
    return result.exit_code;
  });
}
