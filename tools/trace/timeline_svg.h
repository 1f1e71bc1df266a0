// One training step of a Chrome trace (Perfetto JSON) as an SVG timeline: a block of two lanes
// per rank (pid), compute and communication, over the step's window, with a time axis in ms,
// a legend and the title.
//
// The window runs from the earliest begin to the latest end of the ranks' "step" spans with
// args.step == step. The compute lane holds the top-level spans of the compute thread (the
// thread named "compute", else the one holding the step span) coloured by category (forward
// ops, autograd backward, optimizer, data, FSDP), with its "wait" spans (exposed
// communication) in red on top; the communication lane holds every "collective" span of the
// rank, on any thread, coloured by phase and kind and labelled with its FSDP owner where it
// fits. Every rect has a tooltip (<title>: name, duration, args). Spans narrower than a pixel
// merge with their neighbours into one rect per run, so a lane holds at most a few rects per
// pixel column however many spans the step has.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace dtr::trace_view {

// The SVG timeline of step `step` of `trace` ({"traceEvents": [...]}), as text. ValueError
// when the trace has no traceEvents array or ranks, or when a rank lacks the step's span
// (naming the step and those ranks).
std::string step_timeline_svg(const nlohmann::json& trace, int64_t step, std::string_view title);

// Writes step_timeline_svg(...) to `path` atomically (path + ".tmp", then a rename); OSError
// naming the path and the failed call on failure.
void write_step_timeline_svg(const nlohmann::json& trace, int64_t step, std::string_view title,
                             const std::string& path);

}  // namespace dtr::trace_view
