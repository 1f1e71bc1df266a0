#include "tools/trace/model_check.h"

#include <fmt/format.h>

#include <cmath>

namespace dtr::trace {

ModelCheck check_model(const std::vector<StepComm>& steps, const CostModel& model) {
  ModelCheck out;
  std::vector<CostSample> measured;
  for (const StepComm& s : steps) {
    for (const CollectiveTiming& c : s.collectives) {
      const std::optional<CollectiveKind> kind = collective_kind_from_name(c.kind);
      const std::optional<double> seconds =
          kind ? model.predict_seconds(*kind, c.group_size, c.bytes) : std::optional<double>{};
      if (!seconds || c.time.total_us <= 0) {
        ++out.unpredicted;
        continue;
      }
      const double predicted = *seconds * 1e6;
      out.rows.push_back({&s, &c, predicted, std::abs(predicted - c.time.total_us) / c.time.total_us});
      measured.push_back({*kind, c.group_size, c.bytes, c.time.total_us * 1e-6});
    }
  }
  if (!measured.empty()) out.error = model.relative_error(measured);
  return out;
}

std::string model_check_table(const ModelCheck& check) {
  std::string out =
      fmt::format("{:>4} | {:>5} | {:>14} | {:>5} | {:>10} | {:>19} | {:>10} | {:>11} | {:>12} | {:>6}\n", "rank",
                  "step", "kind", "ranks", "bytes", "phase", "owner", "measured ms", "predicted ms", "error");
  for (const PredictedCollective& r : check.rows) {
    const CollectiveTiming& c = *r.collective;
    out +=
        fmt::format("{:>4} | {:>5} | {:>14} | {:>5} | {:>10} | {:>19} | {:>10} | {:>11.3f} | {:>12.3f} | {:>5.0f}%\n",
                    r.step->rank, r.step->step, c.kind, c.group_size, c.bytes, c.phase.empty() ? "-" : c.phase,
                    c.owner.empty() ? "-" : c.owner, c.time.total_us / 1e3, r.predicted_us / 1e3, 100 * r.error);
  }
  out += fmt::format("model error over {} collectives: median {:.0f}%, worst {:.0f}%", check.rows.size(),
                     100 * check.error.median, 100 * check.error.worst);
  if (check.unpredicted > 0) out += fmt::format(" ({} of kinds the model has no fit for left out)", check.unpredicted);
  return out + "\n";
}

}  // namespace dtr::trace
