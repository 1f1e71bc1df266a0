// Step timelines, checked on the SVG text of a synthetic 2-rank trace: a well-formed document
// (balanced tags, escaped title and tooltips) with a rank label and a compute and a comm lane
// per rank, a rect with its tooltip per collective, the compute thread's top-level spans only,
// the waits drawn (nested ones too), the window equal to the union of the ranks' step spans,
// sub-pixel spans merged so that 10k of them stay a small file, the missing-step ValueError,
// and the atomic write.
#include "tools/trace/timeline_svg.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/testing/svg_text.h"
#include "tests/testing/test_util.h"

namespace dtr::trace_view {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::MessageContains;
using testing::texts_of_class;

// The plot spans x = 190 .. 1176 of the 1200 px image.
constexpr double kPlotLeft = 190, kPlotRight = 1176;

struct RectInfo {
  std::string cls;
  double x, y, width, height;
  std::string fill, tooltip;
};

// Every <rect class="..." x= width= fill=><title>...</title></rect> (the drawn spans and steps).
std::vector<RectInfo> rects(const std::string& svg) {
  const std::regex element(
      "<rect class=\"([a-z ]+)\" x=\"([0-9.]+)\" y=\"([0-9.]+)\" width=\"([0-9.]+)\" height=\"([0-9.]+)\" "
      "fill=\"([^\"]+)\"[^>]*><title>([^<]*)</title></rect>");
  std::vector<RectInfo> out;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), element); it != std::sregex_iterator(); ++it) {
    out.push_back({(*it)[1].str(), std::stod((*it)[2].str()), std::stod((*it)[3].str()), std::stod((*it)[4].str()),
                   std::stod((*it)[5].str()), (*it)[6].str(), (*it)[7].str()});
  }
  return out;
}

std::vector<RectInfo> rects_of_class(const std::string& svg, const std::string& cls) {
  std::vector<RectInfo> out;
  for (RectInfo& r : rects(svg)) {
    if (r.cls == cls || r.cls == cls + " merged") out.push_back(std::move(r));
  }
  return out;
}

// Well-formed XML as far as an SVG writer can get it wrong: every tag closed in order, one
// root element, and every & the start of an entity. Returns "" or what is wrong.
std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  int roots = 0;
  for (size_t at = 0; at < xml.size(); ++at) {
    if (xml[at] == '&') {
      static const std::regex entity("&(amp|lt|gt|quot|apos|#[0-9]+);");
      if (!std::regex_search(xml.substr(at, 8), entity, std::regex_constants::match_continuous)) {
        return "a bare & at " + std::to_string(at);
      }
      continue;
    }
    if (xml[at] == '>') return "a bare > at " + std::to_string(at);
    if (xml[at] != '<') continue;
    const size_t end = xml.find('>', at);
    if (end == std::string::npos) return "an unclosed < at " + std::to_string(at);
    const std::string tag = xml.substr(at + 1, end - at - 1);
    at = end;
    if (tag.empty() || tag[0] == '?' || tag[0] == '!') continue;
    if (tag.find('<') != std::string::npos) return "a < inside tag " + tag;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) {
        return "</" + tag.substr(1) + "> closes " + (open.empty() ? "nothing" : "<" + open.back() + ">");
      }
      open.pop_back();
      continue;
    }
    if (open.empty()) ++roots;
    if (tag.back() == '/') continue;
    open.push_back(tag.substr(0, tag.find_first_of(" \n\t")));
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  if (roots != 1) return std::to_string(roots) + " root elements";
  return "";
}

json metadata(const char* what, int pid, int tid, const std::string& name) {
  json m = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", {{"name", name}}}};
  if (tid >= 0) m["tid"] = tid;
  return m;
}

json span(const std::string& name, const std::string& cat, int pid, int tid, double ts, double dur,
          json args = json::object()) {
  return {{"ph", "X"},  {"name", name}, {"cat", cat}, {"pid", pid},
          {"tid", tid}, {"ts", ts},     {"dur", dur}, {"args", std::move(args)}};
}

json collective(const std::string& kind, int pid, int tid, double ts, double dur, int seq, const std::string& phase,
                const std::string& owner) {
  return span(kind, "collective", pid, tid, ts, dur,
              {{"kind", kind}, {"group", "dp"}, {"seq", seq}, {"bytes", 4096}, {"phase", phase}, {"owner", owner}});
}

constexpr int kCompute = 1, kComm = 2, kOther = 3;

// Two ranks; step 4 runs 0..400 us on rank 0 and 500..900 us on rank 1, step 5 runs 1000..11000 us on rank 0 and
// 1500..12000 us on rank 1. Each rank: data, a forward op (holding a kernel), an exposed wait, autograd backward
// (holding a second wait), the optimizer; on its comm thread a forward and a backward all_gather and a reduce_scatter.
// Rank 1 also ran an all_reduce itself, inside its first wait.
json two_rank_trace() {
  json events = json::array();
  for (int rank : {0, 1}) {
    const double o = 500.0 * rank;
    events.push_back(metadata("process_name", rank, -1, "rank " + std::to_string(rank)));
    events.push_back(metadata("thread_name", rank, kCompute, "compute"));
    events.push_back(metadata("thread_name", rank, kComm, "comm dp"));
    events.push_back(metadata("thread_name", rank, kOther, "thread 3"));
    events.push_back(span("step", "step", rank, kCompute, 0 + o, 400, {{"step", 4}}));
    events.push_back(span("step", "step", rank, kCompute, 1000 + o, 10000 + o, {{"step", 5}}));
    events.push_back(span("load batch", "data", rank, kCompute, 1000 + o, 500));
    events.push_back(span("aten.mm", "op", rank, kCompute, 1600 + o, 2000, {{"shapes", "[4, 8] <f32> & 'x'"}}));
    events.push_back(span("mm_kernel_child", "kernel", rank, kCompute, 1700 + o, 500));
    events.push_back(span("wait", "wait", rank, kCompute, 3700 + o, 800, {{"group", "dp"}, {"seq", 1}}));
    events.push_back(span("MmBackward", "autograd", rank, kCompute, 4600 + o, 3000));
    events.push_back(span("wait", "wait", rank, kCompute, 5000 + o, 400, {{"group", "dp"}, {"seq", 2}}));
    events.push_back(span("adamw", "optimizer", rank, kCompute, 8000 + o, 2000));
    events.push_back(span("side_kernel", "kernel", rank, kOther, 2000 + o, 3000));
    events.push_back(collective("all_gather", rank, kComm, 1100 + o, 2400, 0, "forward all_gather", "layers.0"));
    events.push_back(collective("all_gather", rank, kComm, 4700 + o, 1000, 2, "backward all_gather", "layers.1"));
    events.push_back(collective("reduce_scatter", rank, kComm, 6000 + o, 1500, 3, "reduce_scatter", "layers.0"));
    events.push_back({{"ph", "i"}, {"name", "mark"}, {"pid", rank}, {"tid", kCompute}, {"ts", 2000 + o}, {"s", "t"}});
    events.push_back({{"ph", "s"}, {"name", "flow"}, {"pid", rank}, {"tid", kCompute}, {"ts", 2000 + o}, {"id", 1}});
  }
  events.push_back(collective("all_reduce", 1, kCompute, 3800 + 500, 600, 1, "", ""));
  return {{"traceEvents", std::move(events)}};
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_CASE("xml_problem: finds what breaks well-formedness", "[timeline_svg]") {
  CHECK(xml_problem("<svg><g><rect/></g><text>a &amp; b</text></svg>\n").empty());
  CHECK_FALSE(xml_problem("<svg><g></svg>").empty());
  CHECK_FALSE(xml_problem("<svg><g></text></g></svg>").empty());
  CHECK_FALSE(xml_problem("<svg>a & b</svg>").empty());
  CHECK_FALSE(xml_problem("<svg>a < b</svg>").empty());
  CHECK_FALSE(xml_problem("<svg/><svg/>").empty());
}

TEST_CASE("step_timeline_svg: a well-formed SVG with a rank label and two lanes per rank", "[timeline_svg]") {
  const std::string svg = step_timeline_svg(two_rank_trace(), 5, "fsdp on 2 ranks <step 5> & more");
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  REQUIRE(svg.size() >= 7);
  CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
  INFO(svg.substr(0, 3000));
  CHECK(xml_problem(svg).empty());
  CHECK(svg.find("shapes: [4, 8] &lt;f32&gt; &amp; &apos;x&apos;</title>") != std::string::npos);
  CHECK(texts_of_class(svg, "title") == std::vector<std::string>{"fsdp on 2 ranks &lt;step 5&gt; &amp; more"});
  CHECK(texts_of_class(svg, "rank") == std::vector<std::string>{"rank 0", "rank 1"});
  CHECK(texts_of_class(svg, "lane") == std::vector<std::string>{"compute", "comm", "compute", "comm"});
  // The legend names what is drawn, and only that.
  const std::vector<std::string> legend = texts_of_class(svg, "legend");
  for (const char* entry : {"forward ops", "autograd backward", "optimizer", "data", "exposed communication (wait)",
                            "forward all_gather", "backward all_gather", "reduce_scatter", "all_reduce"}) {
    CHECK(std::find(legend.begin(), legend.end(), entry) != legend.end());
  }
  CHECK(std::find(legend.begin(), legend.end(), "fsdp") == legend.end());
  CHECK(legend.size() == 9);
  CHECK(texts_of_class(svg, "xlabel").size() == 1);
}

TEST_CASE("step_timeline_svg: a rect with its tooltip per collective, owners as labels", "[timeline_svg]") {
  const std::string svg = step_timeline_svg(two_rank_trace(), 5, "t");
  const std::vector<RectInfo> comm = rects_of_class(svg, "comm");
  REQUIRE(comm.size() == 7);  // three per rank on the comm thread, and rank 1's all_reduce on its compute thread
  int all_reduce = 0;
  for (const RectInfo& r : comm) {
    INFO(r.tooltip);
    CHECK(r.cls == "comm");
    CHECK(r.tooltip.find("group: dp") != std::string::npos);
    CHECK(r.tooltip.find("bytes: 4096") != std::string::npos);
    CHECK(r.tooltip.find("seq: ") != std::string::npos);
    CHECK(r.tooltip.find(" at +") != std::string::npos);
    all_reduce += r.tooltip.rfind("all_reduce\n", 0) == 0;
  }
  CHECK(all_reduce == 1);
  // The forward all_gather of rank 0 (1100..3500 us of the 1000..12000 window), to the pixel.
  const double px_per_us = (kPlotRight - kPlotLeft) / 11000;
  CHECK(comm[0].tooltip.rfind("all_gather\ncollective, 2.40 ms at +0.100 ms", 0) == 0);
  CHECK(comm[0].x == Approx(kPlotLeft + 100 * px_per_us).margin(0.01));
  CHECK(comm[0].width == Approx(2400 * px_per_us).margin(0.01));
  CHECK(comm[0].tooltip.find("phase: forward all_gather") != std::string::npos);
  CHECK(comm[0].tooltip.find("owner: layers.0") != std::string::npos);
  // Forward and backward all_gathers differ in colour.
  CHECK(comm[0].fill != comm[1].fill);
  const std::vector<std::string> labels = texts_of_class(svg, "label");
  CHECK(std::count(labels.begin(), labels.end(), "layers.0") == 4);
  CHECK(std::count(labels.begin(), labels.end(), "layers.1") == 2);
}

TEST_CASE("step_timeline_svg: collectives that overlap in time get rows of their own", "[timeline_svg]") {
  json trace = two_rank_trace();
  // Rank 0's tensor-parallel all_reduce runs beside its forward all_gather.
  trace["traceEvents"].push_back(collective("all_reduce", 0, 4, 2000, 1000, 0, "", ""));
  const std::string svg = step_timeline_svg(trace, 5, "t");
  const std::vector<RectInfo> comm = rects_of_class(svg, "comm");
  REQUIRE(comm.size() == 8);
  for (size_t i = 0; i < comm.size(); ++i) {
    INFO(i << ": " << comm[i].tooltip);
    CHECK(comm[i].height == Approx(i < 4 ? 11 : 22));  // rank 0's four share the lane in two rows
  }
  // The all_gather keeps the first row; the all_reduce beside it takes the second.
  CHECK(comm[0].tooltip.rfind("all_gather\n", 0) == 0);
  CHECK(comm[3].tooltip.rfind("all_reduce\n", 0) == 0);
  CHECK(comm[3].y == Approx(comm[0].y + 11));
}

TEST_CASE("step_timeline_svg: the compute lane holds the top-level spans; waits are drawn on top", "[timeline_svg]") {
  const std::string svg = step_timeline_svg(two_rank_trace(), 5, "t");
  const std::vector<RectInfo> compute = rects_of_class(svg, "compute");
  std::vector<std::string> names;
  for (const RectInfo& r : compute) names.push_back(r.tooltip.substr(0, r.tooltip.find('\n')));
  const std::vector<std::string> one_rank = {"load batch", "aten.mm", "MmBackward", "adamw"};
  std::vector<std::string> both = one_rank;
  both.insert(both.end(), one_rank.begin(), one_rank.end());
  CHECK(names == both);  // neither the kernel inside aten.mm, nor thread 3's kernel, nor a step
  CHECK(svg.find("mm_kernel_child") == std::string::npos);
  CHECK(svg.find("side_kernel") == std::string::npos);

  // Both waits per rank, the one inside the backward too, in red, after the compute rects.
  const std::vector<RectInfo> waits = rects_of_class(svg, "wait");
  REQUIRE(waits.size() == 4);
  for (const RectInfo& w : waits) {
    CHECK(w.fill == "#d62728");
    CHECK(w.tooltip.find("group: dp") != std::string::npos);
  }
  CHECK(waits[1].tooltip.find("seq: 2") != std::string::npos);
  CHECK(svg.find("<rect class=\"wait\"") > svg.find("MmBackward"));
  // 1.2 ms of rank 0's 10 ms step waits.
  CHECK(texts_of_class(svg, "rank-summary") ==
        std::vector<std::string>{"10.00 ms, 12% in wait", "10.50 ms, 11% in wait"});
}

TEST_CASE("step_timeline_svg: the window is the union of the ranks' step spans", "[timeline_svg]") {
  const std::string svg = step_timeline_svg(two_rank_trace(), 5, "t");
  CHECK(texts_of_class(svg, "window") ==
        std::vector<std::string>{"step 5: 11.00 ms on 2 ranks, ts 1000.000 to 12000.000 µs"});
  const std::vector<RectInfo> steps = rects_of_class(svg, "step");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].x == Approx(kPlotLeft).margin(0.01));                    // rank 0 begins first
  CHECK(steps[1].x + steps[1].width == Approx(kPlotRight).margin(0.01));  // rank 1 ends last
  CHECK(steps[0].tooltip == "step 5 on rank 0: 10.00 ms at +0.000 ms");
  const std::vector<std::string> ticks = texts_of_class(svg, "xtick");
  CHECK(ticks == std::vector<std::string>{"0", "2", "4", "6", "8", "10"});
  // Step 4, before the window, leaves nothing behind: no span of it is drawn.
  const std::string step4 = step_timeline_svg(two_rank_trace(), 4, "t");
  CHECK(texts_of_class(step4, "window") ==
        std::vector<std::string>{"step 4: 900.0 us on 2 ranks, ts 0.000 to 900.000 µs"});
  CHECK(rects_of_class(step4, "compute").empty());
  CHECK(rects_of_class(step4, "comm").empty());
}

TEST_CASE("step_timeline_svg: without thread names the compute lane is the step span's thread", "[timeline_svg]") {
  json trace = two_rank_trace();
  json kept = json::array();
  for (const json& e : trace["traceEvents"]) {
    if (e.value("name", "") != "thread_name") kept.push_back(e);
  }
  trace["traceEvents"] = kept;
  const std::string svg = step_timeline_svg(trace, 5, "t");
  CHECK(rects_of_class(svg, "compute").size() == 8);
  CHECK(rects_of_class(svg, "wait").size() == 4);
  CHECK(rects_of_class(svg, "comm").size() == 7);
}

TEST_CASE("step_timeline_svg: a missing step is a ValueError naming it and the ranks without it",
          "[timeline_svg][errors]") {
  CHECK_THROWS_MATCHES(
      step_timeline_svg(two_rank_trace(), 7, "t"), ValueError,
      MessageContains("step 7 is missing on ranks 0, 1") && MessageContains("steps in the trace: 4, 5"));
  json trace = two_rank_trace();
  json kept = json::array();
  for (const json& e : trace["traceEvents"]) {
    if (!(e.value("cat", "") == "step" && e.at("pid") == 1 && e.at("args").at("step") == 5)) kept.push_back(e);
  }
  trace["traceEvents"] = kept;
  CHECK_THROWS_MATCHES(step_timeline_svg(trace, 5, "t"), ValueError,
                       MessageContains("step_timeline_svg: step 5 is missing on rank 1 "));
  CHECK_THROWS_MATCHES(step_timeline_svg(json::array(), 5, "t"), ValueError, MessageContains("traceEvents"));
  CHECK_THROWS_MATCHES(step_timeline_svg(json{{"traceEvents", json::array()}}, 5, "t"), ValueError,
                       MessageContains("no ranks"));
}

TEST_CASE("step_timeline_svg: 10k sub-pixel spans merge into a few rects; isolated ones stay", "[timeline_svg]") {
  // One rank, a 10 ms step: 10,000 spans of 0.8 us, 1 us apart (a pixel is about 10 us), in
  // blocks of 2,000 alternating forward ops and autograd nodes, then 20 lone 0.5 us spans
  // 50 us apart, then 20 lone collectives likewise.
  json events = json::array();
  events.push_back(metadata("process_name", 0, -1, "rank 0"));
  events.push_back(metadata("thread_name", 0, kCompute, "compute"));
  events.push_back(span("step", "step", 0, kCompute, 0, 12000, {{"step", 1}}));
  for (int i = 0; i < 10000; ++i) {
    const bool forward = (i / 2000) % 2 == 0;
    events.push_back(span(forward ? "aten.add" : "AddBackward", forward ? "op" : "autograd", 0, kCompute, i, 0.8));
  }
  for (int i = 0; i < 20; ++i) {
    events.push_back(span("lone", "optimizer", 0, kCompute, 10100 + 50 * i, 0.5));
    events.push_back(collective("all_reduce", 0, kComm, 10100 + 50 * i, 0.5, i, "", ""));
  }
  const std::string svg = step_timeline_svg({{"traceEvents", events}}, 1, "many spans");
  INFO("size " << svg.size());
  CHECK(svg.size() < 40 * 1024);
  CHECK(xml_problem(svg).empty());
  const std::vector<RectInfo> compute = rects_of_class(svg, "compute");
  int64_t merged_spans = 0, merged_rects = 0, lone = 0;
  for (const RectInfo& r : compute) {
    if (r.cls == "compute merged") {
      ++merged_rects;
      merged_spans += std::stoll(r.tooltip.substr(0, r.tooltip.find(' ')));
      CHECK(r.tooltip.find("spans merged") != std::string::npos);
    } else {
      ++lone;
      CHECK(r.width >= 1);
      CHECK(r.tooltip.rfind("lone\n", 0) == 0);
    }
  }
  CHECK(merged_spans == 10000);
  CHECK(merged_rects == 5);  // one per block: forward and backward stay apart
  CHECK(lone == 20);
  // The blocks keep their colours: forward, backward, forward, ...
  REQUIRE(compute.size() >= 2);
  CHECK(compute[0].fill != compute[1].fill);
  CHECK(rects_of_class(svg, "comm").size() == 20);
}

TEST_CASE("write_step_timeline_svg: writes the timeline atomically; an unwritable path is an OSError",
          "[timeline_svg][errors]") {
  const fs::path dir = testing::make_temp_dir("timeline_svg_test");
  const fs::path path = dir / "step.svg";
  const json trace = two_rank_trace();
  write_step_timeline_svg(trace, 5, "t", path.string());
  CHECK(read_file(path) == step_timeline_svg(trace, 5, "t"));
  CHECK_FALSE(fs::exists(dir / "step.svg.tmp"));
  const fs::path missing = dir / "no_such_dir" / "step.svg";
  CHECK_THROWS_MATCHES(write_step_timeline_svg(trace, 5, "t", missing.string()), OSError,
                       MessageContains("write_step_timeline_svg: open(") && MessageContains(missing.string()));
  // A missing step fails before anything is written.
  CHECK_THROWS_AS(write_step_timeline_svg(trace, 9, "t", (dir / "none.svg").string()), ValueError);
  CHECK_FALSE(fs::exists(dir / "none.svg"));
  CHECK_FALSE(fs::exists(dir / "none.svg.tmp"));
}

}  // namespace
}  // namespace dtr::trace_view
