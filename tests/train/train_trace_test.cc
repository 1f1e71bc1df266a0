// The train program's tracer on real ranks (Gloo over loopback): FSDP steps traced with
// StepTracer write Chrome traces whose events follow the schema, nest on every thread, hold
// every collective the counter saw once per rank with its bytes, and whose merged clocks put
// a barrier's end after every rank's start; each step's accounting adds up; and tracing
// changes no result.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "dtensor/ops/view_ops.h"
#include "nn/fully_shard.h"
#include "nn/init.h"
#include "nn/loss.h"
#include "nn/transformer.h"
#include "optim/adam.h"
#include "tests/nn/nn_test_util.h"
#include "tests/testing/multi_rank.h"
#include "tests/testing/test_util.h"
#include "tools/train/train_trace.h"

namespace dtr {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int64_t kVocab = 32, kSeq = 8, kBatch = 4, kSteps = 4;

struct Traced {
  std::vector<double> losses;
  std::map<int64_t, int64_t> calls, bytes;  // per traced step: the counter's
  std::vector<trace::StepComm> comm;
};

// kSteps of FSDP training; with a tracer, steps 2 and 3 are traced in full and step 3 also
// runs a barrier.
Traced train(const DeviceMesh& mesh, train::StepTracer* tracer) {
  nn::manual_seed(42);
  nn::Transformer model(testing::small_causal_lm(kVocab, kSeq));
  for (auto& [name, m] : model.named_modules()) {
    if (m->type_name() == "TransformerBlock") nn::fully_shard(*m, mesh);
  }
  nn::fully_shard(model, mesh);
  optim::AdamW opt({{.params = model.parameters(), .lr = 1e-2}});
  const Tensor tokens = testing::random_tensor({kBatch, kSeq}, kFloat64, 1, 0, kVocab).to(kInt64);
  const Tensor targets = testing::random_tensor({kBatch, kSeq}, kFloat64, 2, 0, kVocab).to(kInt64);
  const DTensor x = distribute_tensor(tokens, mesh, {Shard(0)});
  const DTensor y = reshape(distribute_tensor(targets, mesh, {Shard(0)}), {kBatch * kSeq});
  Traced out;
  for (int64_t step = 1; step <= kSteps; ++step) {
    collective_counter().reset();
    if (tracer != nullptr) tracer->begin(step);
    const DTensor loss = nn::cross_entropy(reshape(model(x), {kBatch * kSeq, kVocab}), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    if (step == 3) default_group()->barrier().wait();
    out.losses.push_back(loss.item());
    if (tracer != nullptr) out.comm.push_back(tracer->end());
    for (const CollectiveCount& c : collective_counter().snapshot()) {
      out.calls[step] += c.calls;
      out.bytes[step] += c.bytes;
    }
  }
  return out;
}

Json read_json(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return Json::parse(in);
}

// Every complete event has the Chrome trace fields with the right types; metadata names
// every process and thread.
void check_schema(const Json& trace) {
  REQUIRE(trace.at("traceEvents").is_array());
  CHECK(trace.at("displayTimeUnit") == "ms");
  for (const Json& e : trace["traceEvents"]) {
    const std::string ph = e.at("ph").get<std::string>();
    CHECK((ph == "X" || ph == "M"));
    CHECK(e.at("pid").is_number_integer());
    CHECK(e.at("name").is_string());
    if (ph == "M") {
      CHECK(e.at("args").is_object());
      if (e["name"] == "process_name" || e["name"] == "thread_name") CHECK(e["args"].at("name").is_string());
      continue;
    }
    CHECK(e.at("tid").is_number_integer());
    CHECK(e.at("cat").is_string());
    CHECK(e.at("ts").is_number());
    CHECK(e.at("ts").get<double>() >= 0);
    CHECK(e.at("dur").get<double>() >= 0);
    CHECK(e.at("args").is_object());
  }
}

// On each (pid, tid) lane, spans are disjoint or nested.
void check_nesting(const Json& trace) {
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> lanes;
  for (const Json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const double ts = e["ts"].get<double>();
    lanes[{e["pid"].get<int>(), e["tid"].get<int>()}].emplace_back(ts, ts + e["dur"].get<double>());
  }
  constexpr double kSlack = 1e-3;  // microseconds: the ns clock printed as us
  for (auto& [lane, spans] : lanes) {
    std::stable_sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    });
    std::vector<double> open;  // ends of the enclosing spans
    for (const auto& [begin, end] : spans) {
      while (!open.empty() && open.back() <= begin + kSlack) open.pop_back();
      if (!open.empty()) CHECK(end <= open.back() + kSlack);
      open.push_back(end);
    }
  }
}

TEST_CASE("traced FSDP steps: schema, nesting, every collective once per rank, aligned clocks, no change",
          "[train][trace]") {
  const fs::path out = testing::make_temp_dir("train_trace");
  testing::run_ranks(2, [&](int rank, int world) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {world}, {"dp"});
    const Traced plain = train(mesh, nullptr);
    train::StepTracer tracer(*default_group(), std::pair<int64_t, int64_t>{2, 3}, out.string());
    const Traced traced = train(mesh, &tracer);
    CHECK(traced.losses == plain.losses);  // bitwise: tracing moves no number

    for (const trace::StepComm& s : traced.comm) {
      CHECK(s.time.collectives == traced.calls.at(s.step));
      CHECK(s.time.exposed_us + s.time.hidden_us == Approx(s.time.total_us));
      CHECK(s.time.exposed_us >= 0);
      CHECK(s.time.exposed_us <= s.step_us);
    }
    const std::string merged_path = tracer.write("train_trace_test");
    const Json mine = read_json(out / "trace" / fmt::format("rank{}.json", rank));
    check_schema(mine);
    check_nesting(mine);
    // Every collective of the traced steps, once, with its bytes; FSDP phases named.
    std::map<int64_t, int64_t> calls, bytes;
    std::map<std::string, int64_t> phases;
    std::vector<std::pair<double, double>> steps;
    for (const Json& e : mine["traceEvents"]) {
      if (e["ph"] != "X") continue;
      CHECK(e["pid"] == rank);
      if (e["cat"] == "step") steps.emplace_back(e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>());
    }
    REQUIRE(steps.size() == 2);
    for (const Json& e : mine["traceEvents"]) {
      if (e["ph"] != "X" || e["cat"] != "collective") continue;
      const double ts = e["ts"].get<double>();
      const int64_t step = ts < steps[1].first ? 2 : 3;
      ++calls[step];
      bytes[step] += e["args"]["bytes"].get<int64_t>();
      phases[e["args"].value("phase", "")] += 1;
    }
    for (int64_t step : {2, 3}) {
      CHECK(calls[step] == traced.calls.at(step));
      CHECK(bytes[step] == traced.bytes.at(step));
    }
    CHECK(phases["forward all_gather"] > 0);
    CHECK(phases["backward all_gather"] > 0);
    CHECK(phases["reduce_scatter"] > 0);
    if (rank != 0) {
      CHECK(merged_path.empty());
      return;
    }
    const Json merged = read_json(merged_path);
    check_schema(merged);
    check_nesting(merged);
    // The barrier of step 3 ends, on every rank, after every rank issued it.
    std::vector<double> issued, ended;
    for (const Json& e : merged["traceEvents"]) {
      if (e["ph"] != "X" || e["args"].value("kind", "") != "barrier") continue;
      if (e["cat"] == "issue") issued.push_back(e["ts"].get<double>());
      if (e["cat"] == "collective") ended.push_back(e["ts"].get<double>() + e["dur"].get<double>());
    }
    REQUIRE(issued.size() == 2);
    REQUIRE(ended.size() == 2);
    CHECK(*std::min_element(ended.begin(), ended.end()) >= *std::max_element(issued.begin(), issued.end()));
    std::set<int> pids;
    for (const Json& e : merged["traceEvents"]) pids.insert(e["pid"].get<int>());
    CHECK(pids == std::set<int>{0, 1});
  });
}

}  // namespace
}  // namespace dtr
