// gpu_plan: FSDP on 8 and 64 H200s planned on paper (docs/gpu_scaling.md): for each model and
// cluster, the all-gather and reduce-scatter bytes each rank moves per step, their times
// from NCCL's published bus bandwidths (an alpha-beta CostModel per cluster), the compute
// at an assumed share of the bf16 peak, how much of the collectives prefetch one group
// ahead hides (tools/plan/fsdp_step_model.h), the step time, tokens/s per GPU and MFU.
//
//   bazel run //tools/plan:gpu_plan [-- --compute-efficiency 0.4]
//
// Each cluster is one bus bandwidth (nccl-tests' busbw, large messages) and one latency for
// all_gather and reduce_scatter; where the figures come from: docs/gpu_scaling.md.
// busbw = algbw (n - 1) / n, so the cost model's beta = busbw n / (n - 1).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "core/units.h"
#include "tools/command_line.h"
#include "tools/plan/fsdp_step_model.h"
#include "tools/tool_main.h"

namespace {

using namespace dtr;
using namespace dtr::bench;

struct Cluster {
  std::string name;
  int64_t gpus;
  double busbw_bytes_per_s, alpha_s;
};

struct Model {
  std::string name;
  PlanModel shape;
};

CostModel nccl_model(const Cluster& c) {
  CostModel m(c.name, "nccl");
  const double n = static_cast<double>(c.gpus);
  const AlphaBeta fit{.alpha_s = c.alpha_s, .beta_bytes_per_s = c.busbw_bytes_per_s * n / (n - 1)};
  m.set(CollectiveKind::kAllGather, c.gpus, fit);
  m.set(CollectiveKind::kReduceScatter, c.gpus, fit);
  return m;
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

int run_main(int argc, char** argv) {
  CLI::App app{"gpu_plan: FSDP step time, collective bytes and overlap on 8 and 64 H200s, on paper"};
  double efficiency = 0.4;
  app.add_option("--compute-efficiency", efficiency, "achieved share of the bf16 dense peak in the model's kernels")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  if (const std::optional<int> exit_code = dtr::parse_command_line("gpu_plan", app, argc, argv)) return *exit_code;

  const std::vector<Cluster> clusters = {{"8 x H200, NVLink 4", 8, 360e9, 15e-6},
                                         {"64 x H200, 8 nodes, IB NDR", 64, 200e9, 60e-6}};
  const std::vector<Model> models = {
      {"the GPU check's: dim 2048, 16 layers, seq 2048, batch 8/GPU",
       {.layers = 16, .dim = 2048, .vocab = 256, .seq_len = 2048, .batch_per_gpu = 8}},
      {"8B class: dim 4096, 32 layers, vocab 128256, seq 8192, batch 1/GPU",
       {.layers = 32, .dim = 4096, .vocab = 128256, .seq_len = 8192, .batch_per_gpu = 1}},
  };
  fmt::print(
      "FSDP (ZeRO-3, bf16 parameters, float32 reduce-scatter, prefetch one group ahead), compute at {:.0f}% "
      "of 989 TFLOP/s\n",
      100 * efficiency);
  for (const Model& model : models) {
    fmt::print("\n{}\n", model.name);
    fmt::print("{:<28} | {:>7} | {:>7} | {:>7} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>12} | {:>5} | {:>6}\n",
               "cluster", "params", "AG GiB", "RS GiB", "compute", "AG", "RS", "exposed", "step", "tokens/s/GPU", "MFU",
               "hidden");
    for (const Cluster& cluster : clusters) {
      const StepPlan p = plan_fsdp_step(
          model.shape,
          {.gpus = cluster.gpus, .peak_tflops = 989, .hbm_bytes_per_s = 4.8e12, .compute_efficiency = efficiency},
          nccl_model(cluster));
      fmt::print(
          "{:<28} | {:>6.2f}B | {:>7.2f} | {:>7.2f} | {:>9} | {:>9} | {:>9} | {:>9} | {:>9} | {:>12.0f} | {:>4.0f}% | "
          "{:>5.1f}%\n",
          cluster.name, static_cast<double>(p.parameters) / 1e9, gib(p.all_gather_bytes), gib(p.reduce_scatter_bytes),
          format_seconds(p.compute_s), format_seconds(p.all_gather_s), format_seconds(p.reduce_scatter_s),
          format_seconds(p.exposed_s), format_seconds(p.step_s), p.tokens_per_s_per_gpu, 100 * p.mfu,
          100 * p.hidden_share());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dtr::tool_main("gpu_plan", [&] { return run_main(argc, argv); });
}
