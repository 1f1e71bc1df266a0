// Exposed-communication accounting on hand-built traces: a collective's exposed part is
// its overlap with wait spans, hidden the rest, so exposed + hidden = total for each one,
// each phase and owner, and the step; a step's exposed time counts a wait that overlapped
// several of its collectives once; inline runs are all exposed; collectives begun outside
// every step are not counted.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "tools/trace/comm_accounting.h"

namespace dtr {
namespace {

using Json = nlohmann::json;

Json span(const char* cat, int pid, int tid, double ts, double dur, Json args = Json::object()) {
  return {{"ph", "X"},  {"name", cat}, {"cat", cat}, {"pid", pid},
          {"tid", tid}, {"ts", ts},    {"dur", dur}, {"args", std::move(args)}};
}

Json collective(int pid, int tid, double ts, double dur, const char* phase, const char* owner, int64_t seq) {
  return span(
      "collective", pid, tid, ts, dur,
      {{"kind", "all_gather"}, {"group", "dp"}, {"seq", seq}, {"bytes", 100}, {"phase", phase}, {"owner", owner}});
}

TEST_CASE("exposed is the overlap with waits, hidden the rest, exposed + hidden = total", "[comm_accounting]") {
  Json events = Json::array();
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", 1}, {"args", {{"name", "compute"}}}});
  events.push_back(span("step", 0, 1, 0, 100, {{"step", 7}}));
  // [10, 30) on the comm thread; the compute thread waits over [25, 40): 5 exposed.
  events.push_back(collective(0, 0, 10, 20, "forward all_gather", "layers.0", 0));
  events.push_back(span("wait", 0, 1, 25, 15, {{"group", "dp"}, {"seq", 0}}));
  // [50, 60) entirely inside the wait [45, 70) (and a second, overlapping wait [55, 65)).
  events.push_back(collective(0, 0, 50, 10, "backward all_gather", "layers.1", 1));
  events.push_back(span("wait", 0, 1, 45, 25));
  events.push_back(span("wait", 0, 1, 55, 10));
  // [80, 90): run inline on the compute thread, inside its own wait: all exposed.
  events.push_back(span("wait", 0, 1, 79, 12));
  events.push_back(collective(0, 1, 80, 10, "reduce_scatter", "layers.1", 2));
  // Never waited for: all hidden; one without a phase counts as "other <kind>".
  events.push_back(span("collective", 0, 0, 92, 4, {{"kind", "all_reduce"}, {"bytes", 8}}));
  // Begun after the step: not counted.
  events.push_back(collective(0, 0, 120, 10, "reduce_scatter", "layers.0", 3));
  // Rank 1: one step, nothing waited.
  events.push_back(span("step", 1, 1, 0, 50, {{"step", 7}}));
  events.push_back(collective(1, 0, 5, 10, "forward all_gather", "layers.0", 0));

  const std::vector<trace::StepComm> steps = trace::account_communication({{"traceEvents", events}});
  REQUIRE(steps.size() == 2);
  const trace::StepComm& s = steps[0];
  CHECK(s.rank == 0);
  CHECK(s.step == 7);
  CHECK(s.step_us == 100);
  REQUIRE(s.collectives.size() == 4);
  CHECK(s.collectives[0].time.exposed_us == Approx(5));
  CHECK(s.collectives[0].time.hidden_us == Approx(15));
  CHECK(s.collectives[1].time.exposed_us == Approx(10));
  CHECK(s.collectives[2].time.exposed_us == Approx(10));
  CHECK(s.collectives[3].time.exposed_us == 0);
  CHECK(s.time.total_us == Approx(44));
  CHECK(s.time.exposed_us == Approx(25));
  CHECK(s.time.exposed_us + s.time.hidden_us == Approx(s.time.total_us));
  CHECK(s.time.collectives == 4);
  CHECK(s.time.bytes == 308);
  CHECK(s.exposed_share() == Approx(0.25));
  CHECK(s.by_phase.at("forward all_gather").exposed_us == Approx(5));
  CHECK(s.by_phase.at("backward all_gather").hidden_us == Approx(0));
  CHECK(s.by_phase.at("reduce_scatter").total_us == Approx(10));
  CHECK(s.by_phase.at("other all_reduce").hidden_us == Approx(4));
  CHECK(s.by_owner.at("layers.1").total_us == Approx(20));
  CHECK(s.by_owner.at("layers.1").exposed_us == Approx(20));
  for (const auto* groups : {&s.by_phase, &s.by_owner}) {
    for (const auto& [name, t] : *groups) CHECK(t.exposed_us + t.hidden_us == Approx(t.total_us));
  }
  CHECK(steps[1].rank == 1);
  CHECK(steps[1].time.hidden_us == Approx(10));
  CHECK(steps[1].time.exposed_us == 0);
  const Json j = trace::to_json(s);
  CHECK(j.at("exposed_ms").get<double>() == Approx(0.025));
  CHECK(j.at("by_phase").at("reduce_scatter").at("collectives").get<int64_t>() == 1);
}

TEST_CASE("collectives in flight together over one wait: the step's exposed time is their union's",
          "[comm_accounting]") {
  Json events = Json::array();
  events.push_back(span("step", 0, 1, 0, 40, {{"step", 1}}));
  // An asynchronous reduce-scatter [0, 30) and the next all-gather [5, 35) on two comm
  // threads, both waited for over [0, 40): each is all exposed, but the step waited 35.
  events.push_back(collective(0, 0, 0, 30, "reduce_scatter", "layers.1", 0));
  events.push_back(collective(0, 2, 5, 30, "forward all_gather", "layers.0", 1));
  events.push_back(span("wait", 0, 1, 0, 40));
  const std::vector<trace::StepComm> steps = trace::account_communication({{"traceEvents", events}});
  REQUIRE(steps.size() == 1);
  const trace::StepComm& s = steps[0];
  CHECK(s.collectives[0].time.exposed_us == Approx(30));
  CHECK(s.collectives[1].time.exposed_us == Approx(30));
  CHECK(s.by_phase.at("reduce_scatter").exposed_us == Approx(30));
  CHECK(s.time.total_us == Approx(60));
  CHECK(s.time.exposed_us == Approx(35));
  CHECK(s.time.hidden_us == Approx(25));
  CHECK(s.exposed_share() <= 1.0);
  CHECK(s.exposed_share() == Approx(35.0 / 40.0));
}

TEST_CASE("a trace without steps accounts nothing", "[comm_accounting]") {
  const Json events = Json::array({collective(0, 0, 10, 20, "forward all_gather", "layers.0", 0)});
  CHECK(trace::account_communication({{"traceEvents", events}}).empty());
}

TEST_CASE("bus bytes weigh each collective by what goes through a rank (nccl-tests' bus factor)", "[comm_accounting]") {
  // On 4 ranks: a ring all_reduce of 400 bytes moves 2 x 3/4 x 400 = 600 through each rank; an
  // all_to_all and an all_gather of 400 (a tree-ordered all_reduce) move 300 each, the same
  // 600 in all, although their sizes add to 800; a collective on one rank moves nothing.
  auto sized = [](double ts, const char* kind, int64_t group_size) {
    return span("collective", 0, 0, ts, 1, {{"kind", kind}, {"bytes", 400}, {"group_size", group_size}});
  };
  Json events = Json::array();
  events.push_back(span("step", 0, 1, 0, 100, {{"step", 1}}));
  events.push_back(sized(10, "all_reduce", 4));
  events.push_back(sized(20, "all_to_all", 4));
  events.push_back(sized(30, "all_gather", 4));
  events.push_back(sized(40, "reduce_scatter", 1));
  const std::vector<trace::StepComm> steps = trace::account_communication({{"traceEvents", events}});
  REQUIRE(steps.size() == 1);
  const trace::StepComm& s = steps[0];
  REQUIRE(s.collectives.size() == 4);
  CHECK(s.collectives[0].time.bus_bytes == Approx(600));
  CHECK(s.collectives[1].time.bus_bytes + s.collectives[2].time.bus_bytes == Approx(600));
  CHECK(s.collectives[3].time.bus_bytes == 0);
  CHECK(s.time.bytes == 1600);
  CHECK(s.time.bus_bytes == Approx(1200));
  CHECK(trace::to_json(s).at("bus_bytes").get<double>() == Approx(1200));
}

}  // namespace
}  // namespace dtr
