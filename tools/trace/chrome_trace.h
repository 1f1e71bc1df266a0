// Traces as Chrome trace / Perfetto JSON: one rank's events, and every rank's in one file
// with the clocks aligned.
//
// A trace is {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}. Each rank is
// a process (pid = rank, named "rank R") and each thread a lane (tid = the tracer's thread
// number, named as set_thread_name named it). Every closed span is a complete event
// {"ph": "X", "name", "cat" (category_name), "pid", "tid", "ts", "dur", "args"}; ts and dur are
// microseconds since `origin_ns` on rank 0's clock. Spans still open when the run stopped
// are left out. Perfetto's UI (ui.perfetto.dev) and chrome://tracing open the files.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "core/trace.h"

namespace dtr::trace {

// This rank's events, its process and thread names first. `offset_ns` is rank 0's clock
// minus this rank's (ClockOffset): it moves the events onto rank 0's clock.
nlohmann::json chrome_events(const std::vector<ThreadEvents>& threads, int rank, int64_t offset_ns, int64_t origin_ns);

// The trace object around `events` (an array), with `other` as its otherData.
nlohmann::json chrome_trace(nlohmann::json events, nlohmann::json other = nlohmann::json::object());

}  // namespace dtr::trace
