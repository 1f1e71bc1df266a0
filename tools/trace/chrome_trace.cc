#include "tools/trace/chrome_trace.h"

#include <fmt/format.h>

namespace dtr::trace {

nlohmann::json chrome_events(const std::vector<ThreadEvents>& threads, int rank, int64_t offset_ns, int64_t origin_ns) {
  using Json = nlohmann::json;
  Json out = Json::array();
  out.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", fmt::format("rank {}", rank)}}}});
  out.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  for (const ThreadEvents& t : threads) {
    out.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", t.thread}, {"args", {{"name", t.name}}}});
  }
  const auto us = [&](int64_t ns) { return static_cast<double>(ns + offset_ns - origin_ns) / 1e3; };
  for (const ThreadEvents& t : threads) {
    for (const Event& e : t.events) {
      if (e.end_ns == 0) continue;
      Json args = Json::object();
      for (const Arg& a : e.args) args[a.key] = Json::parse(a.json);
      if (*e.region != '\0') args["region"] = e.region;
      out.push_back({{"ph", "X"},
                     {"name", e.name},
                     {"cat", category_name(e.category)},
                     {"pid", rank},
                     {"tid", t.thread},
                     {"ts", us(e.begin_ns)},
                     {"dur", static_cast<double>(e.end_ns - e.begin_ns) / 1e3},
                     {"args", std::move(args)}});
    }
  }
  return out;
}

nlohmann::json chrome_trace(nlohmann::json events, nlohmann::json other) {
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

}  // namespace dtr::trace
