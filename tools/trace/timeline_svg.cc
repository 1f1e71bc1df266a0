#include "tools/trace/timeline_svg.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/posix_file.h"
#include "core/units.h"
#include "tools/trace/svg.h"

namespace dtr::trace_view {
namespace {

using nlohmann::json;

constexpr double kWidth = 1200, kLeft = 190, kRight = 24;  // pixels; the labels sit left of kLeft
constexpr double kLaneHeight = 22, kLaneGap = 4, kRankGap = 14;
constexpr double kRankHeight = 2 * kLaneHeight + kLaneGap + kRankGap;
constexpr double kMinPixels = 1;        // spans narrower than this merge with their neighbours
constexpr double kLabelChar = 6;        // about the advance of a 10 px sans-serif character
constexpr double kLegendChar = 7;       // the same at 12 px
constexpr double kMinLabelHeight = 10;  // a thinner rect gets no label
constexpr size_t kMaxArgChars = 160;    // a longer argument value is cut in the tooltip

// What a rect's colour means: one legend entry each, in legend order.
enum class Legend : uint8_t {
  kForward,
  kBackward,
  kOptimizer,
  kData,
  kFsdp,
  kOtherCompute,
  kWait,
  kForwardAllGather,
  kBackwardAllGather,
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kOtherCollective,
  kCount,
};

struct Style {
  const char* label;
  const char* color;
};

// Light fills, so that black labels read on them; the exposed waits alone are saturated.
constexpr std::array<Style, static_cast<size_t>(Legend::kCount)> kStyles = {{
    {"forward ops", "#6baed6"},
    {"autograd backward", "#fdae6b"},
    {"optimizer", "#74c476"},
    {"data", "#bcbddc"},
    {"fsdp", "#c49c94"},
    {"other compute", "#c7c7c7"},
    {"exposed communication (wait)", "#d62728"},
    {"forward all_gather", "#9edae5"},
    {"backward all_gather", "#dbdb8d"},
    {"all_gather", "#aec7e8"},
    {"reduce_scatter", "#f7b6d2"},
    {"all_reduce", "#c5b0d5"},
    {"other collective", "#a0a0a0"},
}};

const Style& style(Legend legend) { return kStyles[static_cast<size_t>(legend)]; }

// A complete ("X") event; times in microseconds, as the trace has them.
struct Span {
  const json* event;
  std::string cat;
  int64_t tid;
  double begin, end;
};

struct Trace {
  std::map<int64_t, std::string> process_names;                     // pid -> "rank 0"
  std::map<std::pair<int64_t, int64_t>, std::string> thread_names;  // (pid, tid) -> "compute"
  std::map<int64_t, std::vector<Span>> spans;                       // pid -> its complete events
  std::set<int64_t> ranks;                                          // every pid named or with spans
};

std::string string_field(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::optional<int64_t> integer_field(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

std::optional<double> number_field(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

// args[key] as text ("" when missing).
std::string arg_text(const Span& span, const char* key) {
  const auto args = span.event->find("args");
  return args != span.event->end() && args->is_object() ? string_field(*args, key) : std::string();
}

// The metadata and complete events of `trace`; other phases (instants, flows) are left out,
// and so are events without an integer pid or a finite ts and dur.
Trace read_trace(const json& trace) {
  DTR_CHECK(trace.is_object() && trace.contains("traceEvents") && trace.at("traceEvents").is_array(), ValueError,
            "step_timeline_svg: not a Chrome trace: expected an object with a \"traceEvents\" array, got {}",
            trace.type_name());
  Trace out;
  for (const json& e : trace.at("traceEvents")) {
    if (!e.is_object()) continue;
    const std::optional<int64_t> pid = integer_field(e, "pid");
    if (!pid) continue;
    const std::string ph = string_field(e, "ph");
    if (ph == "M") {
      const auto args = e.find("args");
      const std::string name = args != e.end() && args->is_object() ? string_field(*args, "name") : "";
      const std::string what = string_field(e, "name");
      if (what == "process_name") {
        out.process_names[*pid] = name;
        out.ranks.insert(*pid);
      } else if (what == "thread_name") {
        out.thread_names[{*pid, integer_field(e, "tid").value_or(0)}] = name;
      }
    } else if (ph == "X") {
      const std::optional<double> ts = number_field(e, "ts"), dur = number_field(e, "dur");
      if (!ts || !dur || *dur < 0) continue;
      out.spans[*pid].push_back({&e, string_field(e, "cat"), integer_field(e, "tid").value_or(0), *ts, *ts + *dur});
      out.ranks.insert(*pid);
    }
  }
  for (auto& [pid, spans] : out.spans) {
    // Begin order, an enclosing span before the spans it holds.
    std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
  }
  return out;
}

bool is_step(const Span& span, int64_t step) {
  if (span.cat != "step") return false;
  const auto args = span.event->find("args");
  if (args == span.event->end() || !args->is_object()) return false;
  const std::optional<int64_t> n = integer_field(*args, "step");
  return n && *n == step;
}

// The steps the trace's "step" spans cover, for an error message: "0, 1, 2" or "0 .. 99 (100 steps)".
std::string steps_present(const Trace& trace) {
  std::set<int64_t> steps;
  for (const auto& [pid, spans] : trace.spans) {
    for (const Span& s : spans) {
      if (s.cat != "step") continue;
      const auto args = s.event->find("args");
      if (args == s.event->end() || !args->is_object()) continue;
      if (const std::optional<int64_t> n = integer_field(*args, "step")) steps.insert(*n);
    }
  }
  if (steps.empty()) return "none (the trace has no \"step\" spans)";
  if (steps.size() <= 12) return fmt::format("{}", fmt::join(steps, ", "));
  return fmt::format("{} .. {} ({} steps)", *steps.begin(), *steps.rbegin(), steps.size());
}

// The spans of `spans` not nested in an earlier one of them (the list in begin order).
std::vector<const Span*> outermost(const std::vector<const Span*>& spans) {
  std::vector<const Span*> out;
  double open_end = -INFINITY;
  for (const Span* s : spans) {
    if (s->begin < open_end) continue;
    out.push_back(s);
    open_end = s->end;
  }
  return out;
}

Legend compute_legend(const std::string& cat) {
  if (cat == "op" || cat == "redistribute" || cat == "kernel") return Legend::kForward;
  if (cat == "autograd") return Legend::kBackward;
  if (cat == "optimizer") return Legend::kOptimizer;
  if (cat == "data") return Legend::kData;
  if (cat == "fsdp") return Legend::kFsdp;
  return Legend::kOtherCompute;
}

Legend collective_legend(const Span& span) {
  std::string kind = arg_text(span, "kind");
  if (kind.empty()) kind = string_field(*span.event, "name");
  const std::string phase = arg_text(span, "phase");
  if (kind == "all_gather") {
    if (phase.find("backward") != std::string::npos) return Legend::kBackwardAllGather;
    if (phase.find("forward") != std::string::npos) return Legend::kForwardAllGather;
    return Legend::kAllGather;
  }
  if (kind == "reduce_scatter") return Legend::kReduceScatter;
  if (kind == "all_reduce") return Legend::kAllReduce;
  return Legend::kOtherCollective;
}

// One span clipped to the window, on its way to a rect.
struct Item {
  double begin, end;  // microseconds, within the window
  Legend legend;
  const Span* span;
};

// What a lane writes inside a rect that is wide enough.
enum class RectLabel : uint8_t { kNone, kName, kOwner };  // kOwner: args.owner, else args.kind

struct Rect {
  double x0, x1;
  Legend legend;
  bool merged;
  std::string tooltip;  // unescaped
  std::string label;    // drawn inside where it fits; unescaped
};

class Timeline {
 public:
  Timeline(double t0, double t1) : t0_(t0), t1_(std::max(t1, t0 + 1e-3)) {}
  double right() const { return kWidth - kRight; }
  double x(double us) const { return kLeft + (us - t0_) / (t1_ - t0_) * (right() - kLeft); }

  // The spans of `spans` that overlap the window, clipped to it.
  std::vector<Item> clip(const std::vector<const Span*>& spans, Legend (*legend)(const Span&)) const {
    std::vector<Item> out;
    for (const Span* s : spans) {
      if (s->end < t0_ || s->begin > t1_) continue;
      out.push_back({std::max(s->begin, t0_), std::min(s->end, t1_), legend(*s), s});
    }
    return out;
  }

  // One rect per span at least kMinPixels wide; each run of narrower spans that follow one
  // another within a pixel becomes one rect coloured by the legend entry with most time in
  // it. A run stops at a wide span, at a gap of a pixel, or at another entry once it is a
  // pixel wide: a lane of spans that do not overlap gets at most three rects per pixel.
  std::vector<Rect> rects(std::vector<Item> items, RectLabel label) const {
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.begin < b.begin; });
    std::vector<Rect> out;
    auto width = [&](const Item& item) { return x(item.end) - x(item.begin); };
    size_t i = 0;
    while (i < items.size()) {
      size_t j = i + 1;
      if (width(items[i]) < kMinPixels) {
        double run_end = items[i].end;
        for (; j < items.size(); ++j) {
          const Item& next = items[j];
          if (width(next) >= kMinPixels || x(next.begin) - x(run_end) >= kMinPixels) break;
          if (next.legend != items[i].legend && x(run_end) - x(items[i].begin) >= kMinPixels) break;
          run_end = std::max(run_end, next.end);
        }
      }
      out.push_back(j == i + 1 ? single(items[i], label) : merged(items.data() + i, items.data() + j));
      i = j;
    }
    return out;
  }

 private:
  // Spans a pixel at least, inside the plot.
  std::pair<double, double> pixels(double begin, double end) const {
    double x0 = x(begin), x1 = std::max(x(end), x0 + kMinPixels);
    if (x1 > right()) x0 = std::max(kLeft, x0 - (x1 - right())), x1 = right();
    return {x0, x1};
  }

  Rect single(const Item& item, RectLabel label_source) const {
    const Span& s = *item.span;
    std::string tooltip = fmt::format("{}\n{}, {} at +{:.3f} ms", string_field(*s.event, "name"), s.cat,
                                      format_seconds((s.end - s.begin) / 1e6), (s.begin - t0_) / 1000);
    const auto args = s.event->find("args");
    if (args != s.event->end() && args->is_object()) {
      for (const auto& [key, value] : args->items()) {
        if (value.is_string() && value.get_ref<const std::string&>().empty()) continue;
        std::string text =
            value.is_string() ? value.get<std::string>() : value.dump(-1, ' ', false, json::error_handler_t::replace);
        if (text.size() > kMaxArgChars) text = text.substr(0, kMaxArgChars) + "...";
        tooltip += fmt::format("\n{}: {}", key, text);
      }
    }
    std::string label;
    if (label_source == RectLabel::kName) label = string_field(*s.event, "name");
    if (label_source == RectLabel::kOwner) label = arg_text(s, "owner");
    if (label_source == RectLabel::kOwner && label.empty()) label = arg_text(s, "kind");
    const auto [x0, x1] = pixels(item.begin, item.end);
    return {.x0 = x0,
            .x1 = x1,
            .legend = item.legend,
            .merged = false,
            .tooltip = std::move(tooltip),
            .label = std::move(label)};
  }

  Rect merged(const Item* first, const Item* last) const {
    std::array<double, static_cast<size_t>(Legend::kCount)> busy{};
    std::array<int64_t, static_cast<size_t>(Legend::kCount)> count{};
    double end = first->end;
    for (const Item* it = first; it != last; ++it) {
      busy[static_cast<size_t>(it->legend)] += it->end - it->begin;
      ++count[static_cast<size_t>(it->legend)];
      end = std::max(end, it->end);
    }
    const auto top = static_cast<Legend>(std::max_element(busy.begin(), busy.end()) - busy.begin());
    double total = 0;
    for (double b : busy) total += b;
    std::string tooltip = fmt::format("{} spans merged (each under a pixel): {} busy in {} at +{:.3f} ms", last - first,
                                      format_seconds(total / 1e6), format_seconds((end - first->begin) / 1e6),
                                      (first->begin - t0_) / 1000);
    for (size_t k = 0; k < busy.size(); ++k) {
      if (count[k] > 0)
        tooltip += fmt::format("\n{}: {} in {} spans", kStyles[k].label, format_seconds(busy[k] / 1e6), count[k]);
    }
    tooltip += fmt::format("\nfirst {}, last {}", string_field(*first->span->event, "name"),
                           string_field(*(last - 1)->span->event, "name"));
    const auto [x0, x1] = pixels(first->begin, end);
    return {.x0 = x0, .x1 = x1, .legend = top, .merged = true, .tooltip = std::move(tooltip), .label = ""};
  }

  double t0_, t1_;
};

// Spans that overlap in time (collectives of two groups' threads) go to rows of their own,
// each to the first row free at its begin: greedy interval packing, at most kMaxRows rows
// (past that, to the row that frees first).
std::vector<std::vector<Item>> pack_rows(std::vector<Item> items) {
  constexpr size_t kMaxRows = 4;
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.begin < b.begin; });
  std::vector<std::vector<Item>> rows;
  std::vector<double> ends;
  for (const Item& item : items) {
    size_t row = 0;
    while (row < rows.size() && ends[row] > item.begin) ++row;
    if (row == rows.size() && rows.size() == kMaxRows) row = std::min_element(ends.begin(), ends.end()) - ends.begin();
    if (row == rows.size()) rows.emplace_back(), ends.push_back(-INFINITY);
    rows[row].push_back(item);
    ends[row] = std::max(ends[row], item.end);
  }
  return rows;
}

// The rects of one lane at `y`, each with its tooltip, then the labels that fit.
void draw_lane(fmt::memory_buffer& buffer, const std::vector<Rect>& rects, const char* cls, double y, double height,
               std::vector<bool>& used) {
  auto out = std::back_inserter(buffer);
  for (const Rect& r : rects) {
    used[static_cast<size_t>(r.legend)] = true;
    fmt::format_to(out,
                   "<rect class=\"{}{}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\">"
                   "<title>{}</title></rect>\n",
                   cls, r.merged ? " merged" : "", r.x0, y, r.x1 - r.x0, height, style(r.legend).color,
                   svg::xml_escape(r.tooltip));
  }
  for (const Rect& r : rects) {
    if (height < kMinLabelHeight || r.label.empty() ||
        (r.x1 - r.x0) < kLabelChar * static_cast<double>(r.label.size()) + 6)
      continue;
    fmt::format_to(out,
                   "<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.35em\" text-anchor=\"middle\" "
                   "font-size=\"10\" pointer-events=\"none\">{}</text>\n",
                   (r.x0 + r.x1) / 2, y + height / 2, svg::xml_escape(r.label));
  }
}

}  // namespace

std::string step_timeline_svg(const json& trace_json, int64_t step, std::string_view title) {
  const Trace trace = read_trace(trace_json);
  DTR_CHECK(!trace.ranks.empty(), ValueError,
            "step_timeline_svg: the trace has no ranks (no process_name metadata and no complete events)");

  // Each rank's span of the step, and the window they cover together.
  std::map<int64_t, const Span*> steps;
  std::vector<int64_t> missing;
  for (int64_t rank : trace.ranks) {
    const Span* found = nullptr;
    if (const auto it = trace.spans.find(rank); it != trace.spans.end()) {
      for (const Span& s : it->second) {
        if (is_step(s, step)) {
          found = &s;
          break;
        }
      }
    }
    if (found == nullptr) missing.push_back(rank);
    steps[rank] = found;
  }
  DTR_CHECK(missing.empty(), ValueError,
            "step_timeline_svg: step {} is missing on {} {} (no \"step\" span with args.step == {}; ranks in the "
            "trace: {}); steps in the trace: {}",
            step, missing.size() == 1 ? "rank" : "ranks", fmt::join(missing, ", "), step, fmt::join(trace.ranks, ", "),
            steps_present(trace));
  double t0 = INFINITY, t1 = -INFINITY;
  for (const auto& [rank, s] : steps) t0 = std::min(t0, s->begin), t1 = std::max(t1, s->end);
  const Timeline timeline(t0, t1);

  const double top = title.empty() ? 40 : 60;
  const double axis_y = top + static_cast<double>(trace.ranks.size()) * kRankHeight - kRankGap + 8;
  fmt::memory_buffer body;  // everything below the title; the height is known only after the legend
  auto out = std::back_inserter(body);

  // Grid lines at the ticks, under the lanes.
  const double window_ms = (t1 - t0) / 1000;
  const double tick = window_ms > 0 ? svg::nice_step(window_ms, static_cast<int>((kWidth - kLeft - kRight) / 100)) : 1;
  std::vector<double> ticks;
  for (int64_t k = 0; static_cast<double>(k) * tick <= window_ms * (1 + 1e-9); ++k) {
    ticks.push_back(static_cast<double>(k) * tick);
  }
  fmt::format_to(out, "<g class=\"grid\" stroke=\"#e5e5e5\" stroke-width=\"1\">\n");
  for (double t : ticks) {
    fmt::format_to(out, "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n",
                   timeline.x(t0 + t * 1000), top - 4, axis_y);
  }
  fmt::format_to(out, "</g>\n");

  std::vector<bool> used(static_cast<size_t>(Legend::kCount), false);
  double y = top;
  for (int64_t rank : trace.ranks) {
    const Span& step_span = *steps.at(rank);
    const auto name_it = trace.process_names.find(rank);
    const std::string rank_name = name_it != trace.process_names.end() && !name_it->second.empty()
                                      ? name_it->second
                                      : fmt::format("pid {}", rank);
    const std::vector<Span>& spans = trace.spans.at(rank);

    // The compute thread: the one named "compute", else the step span's.
    int64_t compute_tid = step_span.tid;
    for (const auto& [key, name] : trace.thread_names) {
      if (key.first == rank && name == "compute") compute_tid = key.second;
    }
    std::vector<const Span*> compute, waits, collectives;
    for (const Span& s : spans) {
      if (s.cat == "collective") collectives.push_back(&s);
      if (s.tid != compute_tid || s.cat == "step") continue;
      compute.push_back(&s);
      if (s.cat == "wait") waits.push_back(&s);
    }
    std::vector<const Span*> compute_top;
    for (const Span* s : outermost(compute)) {
      if (s->cat != "wait" && s->cat != "collective") compute_top.push_back(s);
    }
    waits = outermost(waits);

    double waited = 0;  // within this rank's step
    for (const Span* w : waits)
      waited += std::max(0.0, std::min(w->end, step_span.end) - std::max(w->begin, step_span.begin));
    const double step_us = step_span.end - step_span.begin;

    // The rank's step, behind its lanes.
    const double x0 = timeline.x(step_span.begin), x1 = timeline.x(step_span.end);
    fmt::format_to(out,
                   "<rect class=\"step\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"#f6f6f6\" "
                   "stroke=\"#bbbbbb\"><title>{}</title></rect>\n",
                   x0, y - 2, x1 - x0, 2 * kLaneHeight + kLaneGap + 4,
                   svg::xml_escape(fmt::format("step {} on {}: {} at +{:.3f} ms", step, rank_name,
                                               format_seconds(step_us / 1e6), (step_span.begin - t0) / 1000)));
    const double middle = y + kLaneHeight + kLaneGap / 2;
    fmt::format_to(out, "<text class=\"rank\" x=\"8\" y=\"{:.1f}\" font-weight=\"bold\">{}</text>\n", middle - 3,
                   svg::xml_escape(rank_name));
    fmt::format_to(out, "<text class=\"rank-summary\" x=\"8\" y=\"{:.1f}\" font-size=\"10\" fill=\"#555\">{}</text>\n",
                   middle + 10,
                   svg::xml_escape(fmt::format("{}, {:.0f}% in wait", format_seconds(step_us / 1e6),
                                               step_us > 0 ? 100 * waited / step_us : 0.0)));
    const double comm_y = y + kLaneHeight + kLaneGap;
    for (const auto& [lane, lane_y] : {std::pair{"compute", y}, std::pair{"comm", comm_y}}) {
      fmt::format_to(out,
                     "<text class=\"lane\" x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.35em\" text-anchor=\"end\" "
                     "font-size=\"11\">{}</text>\n",
                     kLeft - 8, lane_y + kLaneHeight / 2, lane);
    }

    draw_lane(body,
              timeline.rects(timeline.clip(compute_top, [](const Span& s) { return compute_legend(s.cat); }),
                             RectLabel::kName),
              "compute", y, kLaneHeight, used);
    draw_lane(body, timeline.rects(timeline.clip(waits, [](const Span&) { return Legend::kWait; }), RectLabel::kNone),
              "wait", y, kLaneHeight, used);
    const std::vector<std::vector<Item>> rows = pack_rows(timeline.clip(collectives, collective_legend));
    for (size_t row = 0; row < rows.size(); ++row) {
      const double row_height = kLaneHeight / static_cast<double>(rows.size());
      draw_lane(body, timeline.rects(rows[row], RectLabel::kOwner), "comm",
                comm_y + static_cast<double>(row) * row_height, row_height, used);
    }
    y += kRankHeight;
  }

  // The time axis, in ms from the window's start.
  fmt::format_to(out,
                 "<line class=\"axis\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#444\"/>\n",
                 kLeft, axis_y, timeline.right(), axis_y);
  for (double t : ticks) {
    const double tx = timeline.x(t0 + t * 1000);
    fmt::format_to(out, "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#444\"/>\n", tx,
                   axis_y, axis_y + 5);
    fmt::format_to(out, "<text class=\"xtick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.6g}</text>\n", tx,
                   axis_y + 18, t);
  }
  fmt::format_to(out, "<text class=\"xlabel\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                 (kLeft + timeline.right()) / 2, axis_y + 36, "ms since the step began on the earliest rank");

  // The legend: the entries drawn, in rows that wrap at the image's width.
  double lx = kLeft, ly = axis_y + 58;
  fmt::format_to(out, "<g class=\"legend\">\n");
  for (size_t k = 0; k < used.size(); ++k) {
    if (!used[k]) continue;
    const double entry = 12 + 6 + kLegendChar * static_cast<double>(std::string_view(kStyles[k].label).size()) + 18;
    if (lx + entry > kWidth - kRight && lx > kLeft) lx = kLeft, ly += 18;
    fmt::format_to(out, "<rect class=\"swatch\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n",
                   lx, ly - 6, kStyles[k].color);
    fmt::format_to(out, "<text class=\"legend\" x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.35em\">{}</text>\n", lx + 18, ly,
                   kStyles[k].label);
    lx += entry;
  }
  fmt::format_to(out, "</g>\n");
  const double height = std::ceil(ly + 16);

  fmt::memory_buffer buffer;
  auto svg_out = std::back_inserter(buffer);
  fmt::format_to(svg_out,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}\" height=\"{1}\" "
                 "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n",
                 kWidth, height);
  if (!title.empty()) fmt::format_to(svg_out, "<title>{}</title>\n", svg::xml_escape(title));
  fmt::format_to(svg_out, "<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", kWidth, height);
  if (!title.empty()) {
    fmt::format_to(svg_out,
                   "<text class=\"title\" x=\"{:.1f}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" "
                   "font-weight=\"bold\">{}</text>\n",
                   kWidth / 2, svg::xml_escape(title));
  }
  fmt::format_to(svg_out,
                 "<text class=\"window\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#555\">step {}: {} on "
                 "{} ranks, ts {:.3f} to {:.3f} µs</text>\n",
                 kWidth / 2, top - 16, step, format_seconds((t1 - t0) / 1e6), trace.ranks.size(), t0, t1);
  buffer.append(body.data(), body.data() + body.size());
  fmt::format_to(svg_out, "</svg>\n");
  return fmt::to_string(buffer);
}

void write_step_timeline_svg(const json& trace, int64_t step, std::string_view title, const std::string& path) {
  write_file_atomically(path, step_timeline_svg(trace, step, title), "write_step_timeline_svg");
}

}  // namespace dtr::trace_view
