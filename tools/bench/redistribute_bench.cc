// redistribute_bench: DTensor::redistribute against the raw ProcessGroup collective that
// moves the same bytes, on a 1-D CPU mesh (Gloo over loopback).
//
//   bazel run //tools/bench:redistribute_bench -- --ranks 2     (and --ranks 4)
//
// Rows: Shard(0) -> Replicate, Partial(sum) -> Shard(0) and Partial(sum) -> Replicate, each
// against all_gather, reduce_scatter or all_reduce, 64 KiB to 64 MiB. Checked first, then
// timed in batches, dtr and raw interleaved; raw/dtr is the median over batch pairs. Starts
// its own ranks unless it runs under dtrrun. Method and goal: docs/redistribute_bench.md.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/units.h"
#include "dtensor/device_mesh.h"
#include "dtensor/dtensor.h"
#include "dtensor/redistribute_plan.h"
#include "tools/command_line.h"
#include "tools/launcher/self_launch.h"
#include "tools/tool_main.h"

namespace dtr::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kColumns = 1024;

// Integers in [-8, 8] from a hash of the index: sums over ranks stay exact in float32.
Tensor pattern(int64_t rows) {
  Tensor t = Tensor::empty({rows, kColumns}, kFloat32);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    p[i] = static_cast<float>(((static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull) >> 59) % 17) - 8.0f;
  }
  return t;
}

// expected * scale == actual, element by element (exact: the values are small integers).
bool equals_scaled(const Tensor& actual, const Tensor& expected, float scale) {
  if (actual.shape() != expected.shape()) return false;
  const Tensor a = actual.contiguous(), e = expected.contiguous();
  const float* pa = a.data_ptr<float>();
  const float* pe = e.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (pa[i] != pe[i] * scale) return false;
  }
  return true;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One transition and the raw collective it is measured against.
struct Transition {
  const char* name;
  const char* raw_name;
  Placement from;
  Placement to;
  double busbw_factor(int64_t n) const {
    return to.is_replicate() && from.is_partial() ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
  }
};

// What one row needs on this rank: the source DTensor, the raw call on its own buffers,
// and the check of a redistribute result.
struct RowSetup {
  DTensor x;
  std::function<void()> raw;
  std::function<bool(const Tensor&)> check;
};

RowSetup setup_row(const Transition& t, const DeviceMesh& mesh, int64_t rows) {
  ProcessGroup& group = mesh.group(0);
  const int64_t n = mesh.size(), r = mesh.local_rank(0), chunk = rows / n;
  const Tensor full = pattern(rows);
  const Shape shape = full.shape();
  const Tensor own_chunk = full.narrow(0, r * chunk, chunk).clone();
  const float scale = static_cast<float>(n);
  RowSetup s;
  if (t.from.is_shard()) {
    s.x = from_local(own_chunk, mesh, {t.from}, shape);
    Tensor out = Tensor::empty(shape, kFloat32);
    s.raw = [&group, out, in = own_chunk.clone()]() mutable { group.all_gather_into_tensor(out, in).wait(); };
    s.check = [full](const Tensor& y) { return equals_scaled(y, full, 1.0f); };
  } else if (t.to.is_shard()) {
    s.x = from_local(full, mesh, {t.from}, shape);
    Tensor out = Tensor::empty({chunk, kColumns}, kFloat32);
    s.raw = [&group, out, in = full.clone()]() mutable { group.reduce_scatter_tensor(out, in).wait(); };
    s.check = [own_chunk, scale](const Tensor& y) { return equals_scaled(y, own_chunk, scale); };
  } else {
    s.x = from_local(full, mesh, {t.from}, shape);
    // In place, as nccl-tests runs it: the values grow by n per call and overflow to inf
    // (same sign on every rank, so never NaN); the sum's speed does not depend on them.
    s.raw = [&group, buffer = full.clone()]() mutable { group.all_reduce(buffer).wait(); };
    s.check = [full, scale](const Tensor& y) { return equals_scaled(y, full, scale); };
  }
  return s;
}

// Calls per timed batch: enough to cover a few ms at small sizes, few at large ones.
int64_t batch_count(int64_t bytes) {
  if (bytes <= (int64_t{64} << 10)) return 50;
  if (bytes <= (int64_t{1} << 20)) return 20;
  if (bytes <= (int64_t{16} << 20)) return 5;
  return 3;
}

// The median of single plan_redistribute calls, in µs.
double planner_us(const DTensorSpec& spec, const Placements& target) {
  constexpr int kWarmup = 50, kSamples = 1000;
  size_t sink = 0;
  for (int i = 0; i < kWarmup; ++i) sink += plan_redistribute(spec, target).steps().size();
  std::vector<double> us(kSamples);
  for (double& u : us) {
    const auto start = Clock::now();
    sink += plan_redistribute(spec, target).steps().size();
    u = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  }
  DTR_INTERNAL_ASSERT(sink > 0, "plans without steps for {}", spec.to_string());
  return median(us);
}

// Runs one row on every rank; rank 0 prints it. Returns false when the check failed on any rank.
bool run_row(const Transition& t, const DeviceMesh& mesh, int64_t bytes, int64_t batches) {
  ProcessGroup& group = mesh.group(0);
  const int64_t n = mesh.size(), rows = bytes / (kColumns * 4);
  RowSetup s = setup_row(t, mesh, rows);
  const Placements target = {t.to};
  auto dtr_call = [&] { s.x.redistribute(target).to_local(); };

  Tensor verdict = Tensor::from_vector(std::vector<int64_t>{s.check(s.x.redistribute(target).to_local()) ? 0 : 1});
  group.all_reduce(verdict, ReduceOp::kMax).wait();
  const bool ok = verdict.data_ptr<int64_t>()[0] == 0;

  for (int i = 0; i < 2; ++i) {
    dtr_call();
    s.raw();
  }
  const int64_t count = batch_count(bytes);
  auto time_batch = [&](const std::function<void()>& call) {
    group.barrier().wait();
    const auto start = Clock::now();
    for (int64_t i = 0; i < count; ++i) call();
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count() / static_cast<double>(count);
  };
  // [dtr batch times..., raw batch times...], then max over ranks.
  Tensor ms = Tensor::empty({2 * batches}, kFloat64);
  double* m = ms.data_ptr<double>();
  for (int64_t b = 0; b < batches; ++b) {
    m[b] = time_batch(dtr_call);
    m[batches + b] = time_batch(s.raw);
  }
  group.all_reduce(ms, ReduceOp::kMax).wait();
  const double plan_us = planner_us(s.x.spec(), target);
  if (mesh.this_rank() != 0) return ok;

  const std::vector<double> dtr_ms(m, m + batches), raw_ms(m + batches, m + 2 * batches);
  std::vector<double> ratios;
  for (int64_t b = 0; b < batches; ++b) ratios.push_back(raw_ms[b] / dtr_ms[b]);
  const double dtr = median(dtr_ms), raw = median(raw_ms);
  const double algbw = static_cast<double>(bytes) / (dtr * 1e6);  // GB/s
  const double raw_algbw = static_cast<double>(bytes) / (raw * 1e6);
  fmt::print(
      "{:<14} | {:<14} | {:>9} | {:>5} | {:>9.3f} | {:>17} | {:>9.3f} | {:>17} | {:>7.3f} | {:>6.2f} | {:>6.2f} | "
      "{:>6.2f} | {:>7.1f} | {}\n",
      t.name, t.raw_name, format_bytes(bytes), count, dtr,
      fmt::format("{:.3f}-{:.3f}", *std::min_element(dtr_ms.begin(), dtr_ms.end()),
                  *std::max_element(dtr_ms.begin(), dtr_ms.end())),
      raw,
      fmt::format("{:.3f}-{:.3f}", *std::min_element(raw_ms.begin(), raw_ms.end()),
                  *std::max_element(raw_ms.begin(), raw_ms.end())),
      median(ratios), algbw, algbw * t.busbw_factor(n), raw_algbw * t.busbw_factor(n), plan_us, ok ? "ok" : "WRONG");
  std::fflush(stdout);
  return ok;
}

// ValueError unless every size splits into whole float32 rows of kColumns on each of n ranks.
void check_sizes(const std::vector<int64_t>& sizes_kib, int64_t n) {
  for (int64_t kib : sizes_kib) {
    DTR_CHECK(kib > 0 && (kib * 1024) % (kColumns * 4 * n) == 0, ValueError,
              "--sizes-kib {}: a float32 [rows, {}] tensor of that size does not split into whole rows over {} "
              "ranks; use multiples of {} KiB",
              kib, kColumns, n, 4 * n);
  }
}

int run_rank(const std::vector<int64_t>& sizes_kib, int64_t batches) {
  set_default_timeout(std::chrono::seconds(120));
  init_process_group(Backend::kGloo);
  const DeviceMesh mesh = init_device_mesh(kCPU, {default_group()->size()}, {"dp"});
  const int64_t n = mesh.size();
  check_sizes(sizes_kib, n);
  const std::vector<Transition> transitions = {
      {"S(0) -> R", "all_gather", Shard(0), Replicate()},
      {"P(sum) -> S(0)", "reduce_scatter", Partial(), Shard(0)},
      {"P(sum) -> R", "all_reduce", Partial(), Replicate()},
  };
  if (mesh.this_rank() == 0) {
    fmt::print(
        "redistribute vs the raw collective: {} ranks, 1-D mesh, Gloo over 127.0.0.1, float32 [rows, {}]; "
        "times in ms per call (median batch, max over ranks; spread over {} batches), bandwidths in GB/s\n",
        n, kColumns, batches);
    fmt::print(
        "{:<14} | {:<14} | {:>9} | {:>5} | {:>9} | {:>17} | {:>9} | {:>17} | {:>7} | {:>6} | {:>6} | {:>6} | "
        "{:>7} | {}\n",
        "transition", "raw", "size", "count", "dtr ms", "dtr spread", "raw ms", "raw spread", "raw/dtr", "algbw",
        "busbw", "raw busbw", "plan us", "check");
    std::fflush(stdout);
  }
  bool all_ok = true;
  for (const Transition& t : transitions) {
    for (int64_t kib : sizes_kib) all_ok = run_row(t, mesh, kib * 1024, batches) && all_ok;
  }
  destroy_process_group();
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace dtr::bench

int main(int argc, char** argv) {
  CLI::App app{"DTensor redistribute vs the raw collective for the same bytes, at N ranks."};
  int ranks = 2;
  std::vector<int64_t> sizes_kib = {64, 1024, 16 * 1024, 64 * 1024};
  int64_t batches = 7;
  app.add_option("--ranks", ranks, "ranks to start (ignored under dtrrun)")->check(CLI::Range(1, 64));
  app.add_option("--sizes-kib", sizes_kib, "global tensor sizes in KiB")->delimiter(',');
  app.add_option("--batches", batches, "timed batches per row")->check(CLI::Range(1, 1000));
  if (const std::optional<int> exit_code = dtr::parse_command_line("redistribute_bench", app, argc, argv))
    return *exit_code;
  return dtr::tool_main("redistribute_bench", [&] {
    if (dtr::launcher::is_rank_process()) return dtr::bench::run_rank(sizes_kib, batches);
    dtr::bench::check_sizes(sizes_kib, ranks);
    const dtr::launcher::SelfLaunchResult result = dtr::launcher::launch_self(ranks, std::span(argv, argc));
    if (result.exit_code != 0) std::cerr << "redistribute_bench: " << result.failure << "\n";
    return result.exit_code;
  });
}
