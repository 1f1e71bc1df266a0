// The train program's tracing: every step records the communication spans (cheap: a few
// per collective) and is accounted (trace/comm_accounting.h) for the step's exposed and
// hidden communication; the steps --trace names record every span and are written at the
// end as Chrome traces (trace/chrome_trace.h): OUT/trace/rank<R>.json, OUT/trace/merged.json
// with every rank's clock moved onto rank 0's (offsets measured through the store at start),
// and OUT/step_timeline.svg (next to loss.svg): the first traced step, compute and
// communication lanes per rank (trace/timeline_svg.h).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/process_group.h"
#include "core/trace.h"
#include "tools/trace/comm_accounting.h"

namespace dtr::train {

class StepTracer {
 public:
  // Collective over `group` when `traced` is set (the clock offsets).
  StepTracer(ProcessGroup& group, std::optional<std::pair<int64_t, int64_t>> traced, std::string out_dir);

  // Opens step `step` (1-based): its span is the outermost on this thread until end().
  void begin(int64_t step);
  // Closes it; this rank's communication in it.
  trace::StepComm end();
  // Collective: writes the traced steps' files (nothing when none was traced). Returns the
  // merged trace's path on rank 0 ("" elsewhere or when nothing was traced).
  std::string write(const std::string& title);

 private:
  ProcessGroup& group_;
  std::optional<std::pair<int64_t, int64_t>> traced_;
  std::string out_dir_;
  int64_t offset_ns_ = 0;
  int64_t step_ = 0;
  std::optional<trace::Span> span_;
  std::vector<trace::ThreadEvents> kept_;  // the traced steps' events, by thread
};

}  // namespace dtr::train
