#include "tools/train/step_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/cuda/cuda_device.h"
#include "core/units.h"
#include "tools/train/mfu.h"
#include "tools/train/train_report.h"

namespace dtr::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Keeps the lines of a metrics file up to `step` (a resumed run redoes the steps after its
// checkpoint; a rank killed mid-write may have left half a line).
void keep_metrics_up_to(const std::filesystem::path& path, int64_t step) {
  std::vector<std::string> kept;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].get<int64_t>() <= step) kept.push_back(line);
  }
  std::ofstream out(path, std::ios::trunc);
  for (const std::string& line : kept) out << line << "\n";
}

}  // namespace

Throughput run_throughput(const TrainConfig& c, const Device& device, int64_t world, int64_t parameters) {
  const std::string gpu = device.is_cuda() ? cuda::device_description(device.index) : "";
  return {.tokens_per_step = static_cast<double>(c.batch_size * c.seq_len),
          .world = world,
          .flops_per_token = model_flops_per_token(parameters, c.layers, c.dim, c.seq_len),
          .peak_tflops = device.is_cuda() ? dense_peak_tflops(gpu, compute_dtype(c)) : std::nullopt};
}

StepLog::StepLog(const TrainConfig& c, const Throughput& throughput, const std::string& resumed_from,
                 int64_t first_step)
    : config_(c), throughput_(throughput), first_step_(first_step) {
  const std::filesystem::path path = std::filesystem::path(c.out) / "metrics.jsonl";
  if (!resumed_from.empty()) keep_metrics_up_to(path, first_step);
  metrics_.open(path, resumed_from.empty() ? std::ios::trunc : std::ios::app);
  start_ = last_line_ = Clock::now();
}

void StepLog::write(const StepRecord& r, const std::vector<double>& peak_bytes, const trace::StepComm& comm) {
  const Throughput& t = throughput_;
  const int64_t world = t.world;
  nlohmann::json line = {{"step", r.step},
                         {"loss", r.loss},
                         {"grad_norm", r.grad_norm},
                         {"lr", r.lr},
                         {"ms", r.ms},
                         {"tokens_per_s", t.tokens_per_step / (r.ms / 1e3)},
                         {"mfu", t.peak_tflops ? nlohmann::json(mfu(t.tokens_per_step / world / (r.ms / 1e3),
                                                                    t.flops_per_token, *t.peak_tflops))
                                               : nlohmann::json(nullptr)},
                         {"peak_bytes", peak_bytes},
                         {"comm", trace::to_json(comm)}};
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  metrics_ << line.dump() << std::endl;  // flushed: a killed run keeps its lines
  const double elapsed = seconds_since(start_);
  const int64_t steps = config_.steps;
  if (r.step % config_.log_every != 0 && r.step != first_step_ + 1 && r.step != steps && !r.val_loss &&
      seconds_since(last_line_) <= 5) {
    return;
  }
  const double per_step = elapsed / static_cast<double>(r.step - first_step_);
  const double peak = *std::max_element(peak_bytes.begin(), peak_bytes.end());
  fmt::print(
      "step {:>{}}/{} | loss {:.4f}{} | grad norm {:.3f} | lr {:.2e} | {:.0f} ms/step | {:.0f} tokens/s{} "
      "| comm {:.0f}% | peak {:.1f} MiB/rank | ETA {}\n",
      r.step, std::to_string(steps).size(), steps, r.loss, r.val_loss ? fmt::format(" | val {:.4f}", *r.val_loss) : "",
      r.grad_norm, r.lr, r.ms, t.tokens_per_step / (r.ms / 1e3),
      t.peak_tflops ? fmt::format(" | MFU {:.1f}%", 100 * mfu(t.tokens_per_step / world / (r.ms / 1e3),
                                                              t.flops_per_token, *t.peak_tflops))
                    : "",
      100 * comm.exposed_share(), mib(peak), format_seconds(per_step * static_cast<double>(steps - r.step)));
  std::fflush(stdout);
  last_line_ = Clock::now();
}

}  // namespace dtr::train
