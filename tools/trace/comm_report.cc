// comm_report: what a trace says about communication, per rank and step: collective time,
// its exposed part (the compute thread waited) and hidden part, by phase; with a cost
// model, every collective's measured time next to the model's prediction and the model's
// error (median and worst).
//
//   bazel run //tools/trace:comm_report -- OUT/trace/merged.json [--cost-model FILE] [--step N]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "collectives/cost_model.h"
#include "core/error.h"
#include "tools/command_line.h"
#include "tools/tool_main.h"
#include "tools/trace/comm_accounting.h"
#include "tools/trace/model_check.h"

namespace dtr::trace {
namespace {

nlohmann::json read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw OSError(errno, fmt::format("comm_report: open('{}')", path));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(fmt::format("comm_report: '{}' is not JSON: {}", path, e.what()));
  }
}

int report(const std::string& path, const std::string& model_path, int64_t only_step) {
  const nlohmann::json trace = read_trace(path);
  DTR_CHECK(trace.is_object() && trace.contains("traceEvents") && trace["traceEvents"].is_array(), ValueError,
            "comm_report: '{}' is not a Chrome trace (no traceEvents array)", path);
  std::vector<StepComm> steps = account_communication(trace);
  if (only_step > 0) std::erase_if(steps, [&](const StepComm& s) { return s.step != only_step; });
  DTR_CHECK(!steps.empty(), ValueError, "comm_report: '{}' has no step spans{} (was it written by train --trace?)",
            path, only_step > 0 ? fmt::format(" for step {}", only_step) : "");
  fmt::print("{:>4} | {:>5} | {:>8} | {:>8} | {:>10} | {:>9} | {:>9} | {:>8} | {}\n", "rank", "step", "step ms",
             "comm ms", "exposed ms", "hidden ms", "exposed %", "hidden %", "exposed ms by phase");
  for (const StepComm& s : steps) {
    std::vector<std::string> phases;
    for (const auto& [phase, t] : s.by_phase) phases.push_back(fmt::format("{} {:.2f}", phase, t.exposed_us / 1e3));
    fmt::print("{:>4} | {:>5} | {:>8.2f} | {:>8.2f} | {:>10.2f} | {:>9.2f} | {:>9.1f} | {:>8.1f} | {}\n", s.rank,
               s.step, s.step_us / 1e3, s.time.total_us / 1e3, s.time.exposed_us / 1e3, s.time.hidden_us / 1e3,
               100 * s.exposed_share(), 100 * s.hidden_share(), fmt::join(phases, ", "));
  }
  if (!model_path.empty()) {
    const CostModel model = CostModel::load(model_path);
    fmt::print("\ncost model {} ({}, {}):\n{}", model_path, model.machine(), model.backend(),
               model_check_table(check_model(steps, model)));
  }
  return 0;
}

}  // namespace
}  // namespace dtr::trace

int main(int argc, char** argv) {
  CLI::App app{"Exposed and hidden communication per rank and step of a dtr trace, and a cost model's error on it."};
  std::string path, model;
  int64_t step = 0;
  app.add_option("TRACE", path, "a Chrome trace written by train --trace (merged.json or rank<R>.json)")->required();
  app.add_option("--cost-model", model, "a cost model JSON (collective_bench --fit-cost-model)");
  app.add_option("--step", step, "only this step")->check(CLI::PositiveNumber);
  if (const std::optional<int> exit_code = dtr::parse_command_line("comm_report", app, argc, argv)) return *exit_code;
  return dtr::tool_main("comm_report", [&] { return dtr::trace::report(path, model, step); });
}
