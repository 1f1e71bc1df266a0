#include "tools/train/train_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "collectives/all_gather_json.h"
#include "collectives/clock_offset.h"
#include "core/error.h"
#include "core/posix_file.h"
#include "tools/trace/chrome_trace.h"
#include "tools/trace/timeline_svg.h"

namespace dtr::train {
namespace {

namespace fs = std::filesystem;

// Appends a run's events to `kept`, joining each thread's with its earlier ones.
void keep(std::vector<trace::ThreadEvents>& kept, std::vector<trace::ThreadEvents> run) {
  for (trace::ThreadEvents& t : run) {
    const auto it = std::find_if(kept.begin(), kept.end(), [&](const auto& k) { return k.thread == t.thread; });
    if (it == kept.end()) {
      kept.push_back(std::move(t));
      continue;
    }
    const auto base = static_cast<int32_t>(it->events.size());
    for (trace::Event& e : t.events) {
      if (e.parent >= 0) e.parent += base;
      it->events.push_back(std::move(e));
    }
  }
}

}  // namespace

StepTracer::StepTracer(ProcessGroup& group, std::optional<std::pair<int64_t, int64_t>> traced, std::string out_dir)
    : group_(group), traced_(traced), out_dir_(std::move(out_dir)) {
  trace::set_thread_name("compute");
  if (traced_) {
    offset_ns_ = measure_clock_offset(*group.store(), group.rank(), group.size(), "train_trace_clock").offset_ns;
  }
}

void StepTracer::begin(int64_t step) {
  step_ = step;
  const bool full = traced_ && traced_->first <= step && step <= traced_->second;
  trace::start(full ? trace::kAllCategories : trace::kCommCategories);
  span_.emplace("step", trace::kStepCategory);
  span_->arg("step", step);
}

trace::StepComm StepTracer::end() {
  span_.reset();
  std::vector<trace::ThreadEvents> run = trace::stop();
  const std::vector<trace::StepComm> steps =
      trace::account_communication(trace::chrome_trace(trace::chrome_events(run, group_.rank(), 0, 0)));
  DTR_INTERNAL_ASSERT(steps.size() == 1, "step {} traced as {} steps", step_, steps.size());
  if (traced_ && traced_->first <= step_ && step_ <= traced_->second) keep(kept_, std::move(run));
  return steps.front();
}

std::string StepTracer::write(const std::string& title) {
  if (!traced_) return "";
  // Time 0 is the earliest event of any rank, on rank 0's clock.
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const trace::ThreadEvents& t : kept_) {
    for (const trace::Event& e : t.events) first = std::min(first, e.begin_ns + offset_ns_);
  }
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const nlohmann::json& f : all_gather_json(&group_, first)) origin = std::min(origin, f.get<int64_t>());
  const nlohmann::json events = trace::chrome_events(kept_, group_.rank(), offset_ns_, origin);
  const nlohmann::json other = {
      {"title", title}, {"steps", {traced_->first, traced_->second}}, {"clock_offset_ns", offset_ns_}};
  const fs::path dir = fs::path(out_dir_) / "trace";
  fs::create_directories(dir);
  write_file_atomically((dir / fmt::format("rank{}.json", group_.rank())).string(),
                        trace::chrome_trace(events, other).dump(), "train --trace");
  const std::vector<nlohmann::json> all = all_gather_json(&group_, events);
  if (group_.rank() != 0) return "";
  nlohmann::json merged = nlohmann::json::array();
  for (const nlohmann::json& rank_events : all) {
    for (const nlohmann::json& e : rank_events) merged.push_back(e);
  }
  const fs::path path = dir / "merged.json";
  const nlohmann::json trace = trace::chrome_trace(std::move(merged), other);
  write_file_atomically(path.string(), trace.dump(), "train --trace");
  trace_view::write_step_timeline_svg(trace, traced_->first, fmt::format("{}: step {}", title, traced_->first),
                                      (fs::path(out_dir_) / "step_timeline.svg").string());
  return path.string();
}

}  // namespace dtr::train
