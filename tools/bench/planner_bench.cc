// planner_bench: the cost of one plan_redistribute call, for representative moves on 1-D,
// 2-D and 3-D meshes, even and uneven, and one coalesced FSDP-style call.
//
//   bazel run -c opt //tools/bench:planner_bench
//
// Each case is checked first (the plan must end at the target), warmed up, then timed
// call by call; the table shows the median and the 10th-90th percentile spread in µs of a
// repeated move (answered by the thread's plan cache), and the median of the candidate
// search a first move runs, with the number of distinct plans it weighs.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "dtensor/device_mesh.h"
#include "dtensor/dtensor_spec.h"
#include "dtensor/placement.h"
#include "dtensor/redistribute_plan.h"
#include "tools/tool_main.h"

namespace {

using namespace dtr;

struct Case {
  const char* name;
  std::vector<DTensorSpec> sources;
  Placements target;
};

DeviceMesh mesh(Shape shape) { return DeviceMesh::row_major(kCPU, shape, {}, 0, shape_numel(shape)); }

void run(const Case& c) {
  const RedistributePlan checked = plan_redistribute_coalesced(c.sources, c.target);
  const Placements& reached = checked.steps().empty() ? checked.source_placements() : checked.steps().back().after;
  DTR_INTERNAL_ASSERT(reached == checked.target_placements(), "the plan of '{}' ends at {}, not {}", c.name,
                      placements_str(reached), placements_str(c.target));
  size_t sink = 0;
  // The median and the 10th and 90th percentiles of `samples` timed calls of f, in µs.
  auto time = [&](int warmup, int samples, auto f) {
    for (int i = 0; i < warmup; ++i) sink += f();
    std::vector<double> us(samples);
    for (int i = 0; i < samples; ++i) {
      const auto start = std::chrono::steady_clock::now();
      sink += f();
      us[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    }
    std::sort(us.begin(), us.end());
    return std::array<double, 3>{us[samples / 2], us[samples / 10], us[samples * 9 / 10]};
  };
  // A repeated move (the thread's plan cache answers), and the search behind a first one.
  const auto cached = time(200, 3000, [&] { return plan_redistribute_coalesced(c.sources, c.target).steps().size(); });
  const auto search = time(20, 300, [&] {
    const std::vector<RedistributePlan> plans = plan_alternatives_coalesced(c.sources, c.target);
    return plans[best_plan_index(plans)].steps().size();
  });
  const DTensorSpec& s = c.sources.front();
  std::printf("%-26s | %-9s | %-40s | %5zu | %5zu | %11lld | %9.2f | %5.2f-%.2f | %9.2f | %zu\n", c.name,
              fmt::format("{}", fmt::join(s.mesh().shape(), "x")).c_str(),
              fmt::format("{} -> {}", placements_str(s.placements()), placements_str(c.target)).c_str(),
              checked.steps().size(), c.sources.size(), static_cast<long long>(checked.total_send_bytes()[0]),
              cached[0], cached[1], cached[2], search[0], plan_alternatives_coalesced(c.sources, c.target).size());
  if (sink == 0) std::printf("(no steps)\n");
}

int run_cases() {
  const DeviceMesh m8 = mesh({8}), m24 = mesh({2, 4}), m222 = mesh({2, 2, 2});
  std::vector<DTensorSpec> fsdp;
  for (int64_t k = 0; k < 64; ++k) fsdp.emplace_back(m8, Placements{Shard(0)}, Shape{1000 + k, 1023}, kBFloat16);
  const std::vector<Case> cases = {
      {"1-D S0->R even", {DTensorSpec(m8, {Shard(0)}, {4096, 1024}, kFloat32)}, {Replicate()}},
      {"1-D S0->S1 uneven", {DTensorSpec(m8, {Shard(0)}, {1023, 4097}, kFloat32)}, {Shard(1)}},
      {"1-D P->S0 uneven", {DTensorSpec(m8, {Partial()}, {4097, 7}, kFloat32)}, {Shard(0)}},
      {"2-D nested uneven", {DTensorSpec(m24, {Shard(0), Shard(0)}, {1023, 4097}, kFloat32)}, {Replicate(), Shard(0)}},
      {"2-D HSDP grad P,P->R,S0",
       {DTensorSpec(m24, {Partial(), Partial()}, {4097, 1023}, kFloat32)},
       {Replicate(), Shard(0)}},
      {"3-D mixed",
       {DTensorSpec(m222, {Shard(0), Shard(1), Partial()}, {1023, 4097, 7}, kFloat32)},
       {Replicate(), Shard(1), Shard(0)}},
      {"1-D coalesced 64 params", fsdp, {Replicate()}},
  };
  std::printf("%-26s | %-9s | %-40s | %5s | %5s | %11s | %9s | %-11s | %9s | %s\n", "case", "mesh", "move", "steps",
              "specs", "rank0 bytes", "median us", "p10-p90 us", "search us", "plans");
  for (const Case& c : cases) run(c);
  return 0;
}

}  // namespace

int main() { return dtr::tool_main("planner_bench", run_cases); }
