#include "tools/trace/comm_accounting.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "collectives/collective_counter.h"

namespace dtr::trace {
namespace {

using Json = nlohmann::json;
using Interval = std::pair<double, double>;

// The union of `intervals` as disjoint intervals in order.
std::vector<Interval> merged(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<Interval> out;
  for (const Interval& i : intervals) {
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

// The length of [begin, end) covered by `disjoint` (sorted).
double covered(const std::vector<Interval>& disjoint, double begin, double end) {
  double sum = 0;
  auto it = std::lower_bound(disjoint.begin(), disjoint.end(), Interval{begin, begin},
                             [](const Interval& a, const Interval& b) { return a.second < b.first; });
  for (; it != disjoint.end() && it->first < end; ++it)
    sum += std::max(0.0, std::min(end, it->second) - std::max(begin, it->first));
  return sum;
}

std::string text_arg(const Json& args, const char* key) {
  return args.contains(key) && args[key].is_string() ? args[key].get<std::string>() : "";
}

int64_t int_arg(const Json& args, const char* key) {
  return args.contains(key) && args[key].is_number() ? args[key].get<int64_t>() : 0;
}

}  // namespace

void CommTime::add(const CommTime& other) {
  total_us += other.total_us;
  exposed_us += other.exposed_us;
  hidden_us += other.hidden_us;
  collectives += other.collectives;
  bytes += other.bytes;
  bus_bytes += other.bus_bytes;
}

std::vector<StepComm> account_communication(const Json& trace) {
  struct Rank {
    std::vector<StepComm> steps;
    std::vector<Interval> waits;
    std::vector<CollectiveTiming> collectives;
  };
  std::map<int, Rank> ranks;
  for (const Json& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", "");
    const int pid = e.value("pid", 0);
    const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
    const Json args = e.value("args", Json::object());
    if (cat == "step") {
      StepComm step;
      step.rank = pid;
      step.step = int_arg(args, "step");
      step.begin_us = ts;
      step.step_us = dur;
      ranks[pid].steps.push_back(std::move(step));
    } else if (cat == "wait") {
      ranks[pid].waits.emplace_back(ts, ts + dur);
    } else if (cat == "collective") {
      CollectiveTiming c;
      c.kind = text_arg(args, "kind");
      c.group = text_arg(args, "group");
      c.phase = text_arg(args, "phase");
      c.owner = text_arg(args, "owner");
      c.seq = int_arg(args, "seq");
      c.bytes = int_arg(args, "bytes");
      c.group_size = std::max<int64_t>(1, int_arg(args, "group_size"));
      c.begin_us = ts;
      c.time.total_us = dur;
      c.time.collectives = 1;
      c.time.bytes = c.bytes;
      if (const std::optional<CollectiveKind> kind = collective_kind_from_name(c.kind)) {
        c.time.bus_bytes = static_cast<double>(c.bytes) * bus_factor(*kind, c.group_size);
      }
      ranks[pid].collectives.push_back(std::move(c));
    }
  }
  std::vector<StepComm> out;
  for (auto& [pid, r] : ranks) {
    const std::vector<Interval> waits = merged(std::move(r.waits));
    std::sort(r.steps.begin(), r.steps.end(),
              [](const StepComm& a, const StepComm& b) { return a.begin_us < b.begin_us; });
    std::sort(r.collectives.begin(), r.collectives.end(),
              [](const CollectiveTiming& a, const CollectiveTiming& b) { return a.begin_us < b.begin_us; });
    for (CollectiveTiming& c : r.collectives) {
      const auto step = std::find_if(r.steps.begin(), r.steps.end(), [&](const StepComm& s) {
        return s.begin_us <= c.begin_us && c.begin_us < s.begin_us + s.step_us;
      });
      if (step == r.steps.end()) continue;
      c.time.exposed_us = std::min(c.time.total_us, covered(waits, c.begin_us, c.begin_us + c.time.total_us));
      c.time.hidden_us = c.time.total_us - c.time.exposed_us;
      step->time.add(c.time);
      step->by_phase[c.phase.empty() ? "other " + c.kind : c.phase].add(c.time);
      if (!c.owner.empty()) step->by_owner[c.owner].add(c.time);
      step->collectives.push_back(std::move(c));
    }
    for (StepComm& s : r.steps) {
      // The step's exposed time: the union of its collectives' spans, where waits cover it.
      std::vector<Interval> spans;
      for (const CollectiveTiming& c : s.collectives) spans.emplace_back(c.begin_us, c.begin_us + c.time.total_us);
      double exposed = 0;
      for (const Interval& span : merged(std::move(spans))) exposed += covered(waits, span.first, span.second);
      s.time.exposed_us = exposed;
      s.time.hidden_us = s.time.total_us - exposed;
      out.push_back(std::move(s));
    }
  }
  return out;
}

nlohmann::json to_json(const StepComm& step) {
  const auto time = [](const CommTime& t) {
    return Json{{"total_ms", t.total_us / 1e3},
                {"exposed_ms", t.exposed_us / 1e3},
                {"hidden_ms", t.hidden_us / 1e3},
                {"collectives", t.collectives},
                {"bytes", t.bytes},
                {"bus_bytes", t.bus_bytes}};
  };
  Json by_phase = Json::object(), by_owner = Json::object();
  for (const auto& [k, t] : step.by_phase) by_phase[k] = time(t);
  for (const auto& [k, t] : step.by_owner) by_owner[k] = time(t);
  Json out = time(step.time);
  out["rank"] = step.rank;
  out["step"] = step.step;
  out["step_ms"] = step.step_us / 1e3;
  out["exposed_share"] = step.exposed_share();
  out["hidden_share"] = step.hidden_share();
  out["by_phase"] = std::move(by_phase);
  out["by_owner"] = std::move(by_owner);
  return out;
}

}  // namespace dtr::trace
