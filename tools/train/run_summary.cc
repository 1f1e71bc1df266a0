#include "tools/train/run_summary.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "tools/train/loss_plot.h"
#include "tools/train/mfu.h"

namespace dtr::train {
namespace {

// A number as JSON: "nan", "inf" or "-inf" as strings (JSON has no such numbers).
nlohmann::json json_value(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(fmt::format("{}", x));
}

}  // namespace

void write_summary(const TrainConfig& c, const Throughput& t, const std::vector<StepRecord>& records,
                   const RunOutcome& outcome, const std::vector<RankFigures>& ranks) {
  if (!outcome.merged_trace.empty()) {
    fmt::print("\nwrote the trace of steps {}: {} (every rank; open in ui.perfetto.dev) and {}/trace/rank<R>.json\n",
               c.trace, outcome.merged_trace, c.out);
  }
  if (outcome.interrupted) fmt::print("train: interrupted; stopped after step {} on every rank\n", outcome.steps);
  const std::optional<StepRecord>& diverged = outcome.diverged;
  if (diverged) {
    fmt::print(
        "train: step {}: the {} is not finite (loss {}, gradient norm {}); stopped on every rank before the "
        "optimizer step, and no checkpoint holds this step (try a lower --lr, --grad-clip or a longer "
        "--warmup)\n",
        diverged->step, std::isfinite(diverged->loss) ? "gradient norm" : "loss", diverged->loss, diverged->grad_norm);
  }
  fmt::print("\n{}", monitoring_table(ranks));
  const std::string digest = outcome.state_digest ? fmt::format("{:016x}", *outcome.state_digest) : "";
  if (outcome.state_digest) {
    fmt::print("\nstate digest (parameters and AdamW state, --deterministic): {}\n", digest);
  }
  std::vector<std::pair<double, double>> train_curve, val_curve;
  for (const StepRecord& r : records) {
    train_curve.emplace_back(static_cast<double>(r.step), r.loss);
    if (r.val_loss) val_curve.emplace_back(static_cast<double>(r.step), *r.val_loss);
  }
  const std::filesystem::path out(c.out);
  write_loss_plot((out / "loss.svg").string(),
                  {{.label = "train", .color = "#1f77b4", .points = train_curve},
                   {.label = "validation", .color = "#d62728", .points = val_curve}},
                  {.title = fmt::format("dtr train: {} on {} ranks", flag_value(c.parallel), t.world),
                   .x_label = "step",
                   .y_label = "loss"});
  const double steps_run = static_cast<double>(outcome.steps_run), train_s = outcome.train_s;
  const int64_t world = t.world;
  nlohmann::json summary = {{"steps", outcome.steps},
                            {"interrupted", outcome.interrupted},
                            {"diverged", diverged ? nlohmann::json{{"step", diverged->step},
                                                                   {"loss", json_value(diverged->loss)},
                                                                   {"grad_norm", json_value(diverged->grad_norm)}}
                                                  : nlohmann::json(nullptr)},
                            {"train_s", train_s},
                            {"tokens_per_s", t.tokens_per_step * steps_run / train_s},
                            {"mfu", t.peak_tflops ? nlohmann::json(mfu(t.tokens_per_step * steps_run / train_s / world,
                                                                       t.flops_per_token, *t.peak_tflops))
                                                  : nlohmann::json(nullptr)},
                            {"resumed_from", outcome.resumed_from},
                            {"state_digest", outcome.state_digest ? nlohmann::json(digest) : nlohmann::json(nullptr)},
                            {"first_loss", records.empty() ? 0.0 : records.front().loss},
                            {"final_loss", records.empty() ? 0.0 : records.back().loss},
                            {"ranks", nlohmann::json::array()}};
  for (const StepRecord& r : records) {
    if (r.val_loss) summary["final_val_loss"] = *r.val_loss;
  }
  for (const RankFigures& f : ranks) summary["ranks"].push_back(to_json(f));
  std::ofstream(out / "summary.json") << summary.dump(2) << "\n";
  fmt::print("\nwrote {}/metrics.jsonl, {}/loss.svg, {}/summary.json, {}/config.json\n", c.out, c.out, c.out, c.out);
}

}  // namespace dtr::train
