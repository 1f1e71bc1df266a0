#include "tools/train/loss_plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>

#include "core/error.h"
#include "core/posix_file.h"
#include "tools/trace/svg.h"

namespace dtr::train {
namespace {

constexpr int kMinWidth = 160, kMinHeight = 120, kMaxSide = 20000;
constexpr size_t kMaxDottedPoints = 50;
constexpr double kCharWidth = 7;  // about the advance of a 12 px sans-serif character
// matplotlib's tab10, for series without a colour.
constexpr std::array<const char*, 10> kPalette = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

enum class Scale : uint8_t { kLinear, kLog };

// One axis: the span it draws, in axis units (log10 of the value on a log axis), and its
// tick values in data units.
struct Axis {
  Scale scale = Scale::kLinear;
  double lo = 0, hi = 1;
  std::vector<double> ticks;

  double unit(double v) const { return scale == Scale::kLog ? std::log10(v) : v; }
  // Where v falls along the axis: 0 at lo, 1 at hi.
  double fraction(double v) const { return (unit(v) - lo) / (hi - lo); }
};

// Widens an empty range [v, v] so that a flat curve sits in the middle of the chart.
void pad_flat(double& lo, double& hi, Scale scale) {
  if (hi > lo) return;
  if (scale == Scale::kLog) {
    lo /= 2, hi *= 2;
  } else {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad, hi += pad;
  }
}

// A linear axis over [lo, hi], widened to whole steps. E.g. 0.3..9.2 with target 6 spans
// 0..10 with ticks 0, 2, 4, 6, 8, 10.
Axis linear_axis(double lo, double hi, int target) {
  pad_flat(lo, hi, Scale::kLinear);
  Axis axis{Scale::kLinear, lo, hi, {}};
  const double step = svg::nice_step(hi - lo, target);
  if (!std::isfinite(step) || step <= 0) {  // a span beyond double's range: ticks at the ends only
    axis.ticks = {lo, hi};
    return axis;
  }
  const int64_t first = static_cast<int64_t>(std::floor(lo / step));
  const int64_t last = static_cast<int64_t>(std::ceil(hi / step));
  axis.lo = static_cast<double>(first) * step;
  axis.hi = static_cast<double>(last) * step;
  // k * step, not a running sum, so that 0 is exactly 0 and errors do not accumulate.
  for (int64_t k = first; k <= last; ++k) axis.ticks.push_back(static_cast<double>(k) * step);
  return axis;
}

// A log axis over [lo, hi] (both > 0), widened to ticks at m x 10^k. The mantissas m are the
// sparsest of {1}, {1, 2, 5}, {1..9} that give at least four ticks: 0.01..100 ticks at the
// decades, 2.5..40 at 2, 5, 10, 20, 50, and 2.5..4 at 2, 3, 4.
Axis log_axis(double lo, double hi, int target) {
  pad_flat(lo, hi, Scale::kLog);
  static const std::vector<std::vector<int>> kMantissas = {{1}, {1, 2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}};
  const int k_lo = static_cast<int>(std::floor(std::log10(lo))) - 1;
  const int k_hi = static_cast<int>(std::ceil(std::log10(hi))) + 1;
  constexpr double kSlack = 1e-9;  // so that a value of exactly 10 counts as a tick at 10
  Axis axis{Scale::kLog, std::log10(lo), std::log10(hi), {}};
  for (const std::vector<int>& mantissas : kMantissas) {
    std::vector<double> candidates;
    for (int k = k_lo; k <= k_hi; ++k) {
      for (int m : mantissas) candidates.push_back(m * std::pow(10.0, k));
    }
    double axis_lo = candidates.front(), axis_hi = candidates.back();
    for (double c : candidates) {
      if (c <= lo * (1 + kSlack)) axis_lo = c;
    }
    for (auto c = candidates.rbegin(); c != candidates.rend(); ++c) {
      if (*c >= hi * (1 - kSlack)) axis_hi = *c;
    }
    std::vector<double> ticks;
    for (double c : candidates) {
      if (c >= axis_lo && c <= axis_hi) ticks.push_back(c);
    }
    if (mantissas.size() == 1 && static_cast<int>(ticks.size()) > target + 1) {
      // Many decades: every n-th one.
      const size_t every = (ticks.size() + target - 1) / target;
      std::vector<double> thinned;
      for (size_t i = 0; i < ticks.size(); i += every) thinned.push_back(ticks[i]);
      ticks = std::move(thinned);
    }
    axis = Axis{Scale::kLog, std::log10(axis_lo), std::log10(axis_hi), std::move(ticks)};
    if (axis.ticks.size() >= 4) break;
  }
  return axis;
}

// "0", "2.5", "0.001", "1e+06": six significant digits hide k * step's rounding (0.30000000000000004).
std::string tick_label(double v) { return fmt::format("{:.6g}", v); }

// The plot area inside the image, in pixels.
struct Frame {
  double left, top, width, height;
  double bottom() const { return top + height; }
  double right() const { return left + width; }
};

struct Pixel {
  double x, y;
};

// Thins a polyline to at most four points per pixel column: for each run of consecutive
// points in one column, its first, lowest, highest and last, in their order (M4 decimation,
// Jugel et al., VLDB 2014). What it drops lies on the line between what it keeps.
std::vector<Pixel> decimate(const std::vector<Pixel>& pixels) {
  std::vector<Pixel> kept;
  size_t start = 0;
  while (start < pixels.size()) {
    const double column = std::floor(pixels[start].x);
    size_t end = start + 1, low = start, high = start;
    for (; end < pixels.size() && std::floor(pixels[end].x) == column; ++end) {
      if (pixels[end].y < pixels[low].y) low = end;
      if (pixels[end].y > pixels[high].y) high = end;
    }
    std::array<size_t, 4> picks = {start, low, high, end - 1};
    std::sort(picks.begin(), picks.end());
    for (size_t i = 0; i < picks.size(); ++i) {
      if (i == 0 || picks[i] != picks[i - 1]) kept.push_back(pixels[picks[i]]);
    }
    start = end;
  }
  return kept;
}

// A point's coordinates rounded to 0.1 px, as integers of tenths (to drop repeats).
std::pair<int64_t, int64_t> tenths(const Pixel& p) { return {std::llround(p.x * 10), std::llround(p.y * 10)}; }

}  // namespace

std::string loss_plot_svg(const std::vector<Series>& series, const PlotOptions& options) {
  const int w = options.width, h = options.height;
  DTR_CHECK(w >= kMinWidth && h >= kMinHeight && w <= kMaxSide && h <= kMaxSide, ValueError,
            "loss_plot_svg: a {} x {} pixel chart is not drawable; width must be in [{}, {}] and height in [{}, {}]", w,
            h, kMinWidth, kMaxSide, kMinHeight, kMaxSide);
  const Scale y_scale = options.log_y ? Scale::kLog : Scale::kLinear;

  // The drawable points of each series, and the range they span.
  std::vector<std::vector<std::pair<double, double>>> drawn(series.size());
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (size_t i = 0; i < series.size(); ++i) {
    for (const auto& [x, y] : series[i].points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (y_scale == Scale::kLog && y <= 0)) continue;
      drawn[i].emplace_back(x, y);
      x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
    }
  }
  const bool has_data = x_lo <= x_hi;

  // The value axis comes first: its widest tick label sets the left margin, which leaves room
  // for the rotated y label at x = 16.
  const double top = options.title.empty() ? 16 : 36, plot_height = h - top - 48;
  Axis y_axis;
  size_t widest_y_tick = 0;
  if (has_data) {
    const int y_target = std::max(2, static_cast<int>(plot_height / 50));
    y_axis = y_scale == Scale::kLog ? log_axis(y_lo, y_hi, y_target) : linear_axis(y_lo, y_hi, y_target);
    for (double t : y_axis.ticks) widest_y_tick = std::max(widest_y_tick, tick_label(t).size());
  }
  const double left = std::max(56.0, 32 + kCharWidth * static_cast<double>(widest_y_tick));
  const Frame frame{left, top, w - left - 24, plot_height};
  fmt::memory_buffer buffer;
  auto out = std::back_inserter(buffer);
  fmt::format_to(out,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}\" height=\"{1}\" "
                 "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n",
                 w, h);
  if (!options.title.empty()) fmt::format_to(out, "<title>{}</title>\n", svg::xml_escape(options.title));
  fmt::format_to(out, "<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", w, h);
  if (!options.title.empty()) {
    fmt::format_to(out,
                   "<text class=\"title\" x=\"{:.1f}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" "
                   "font-weight=\"bold\">{}</text>\n",
                   w / 2.0, svg::xml_escape(options.title));
  }

  if (has_data) {
    const int x_target = std::max(2, static_cast<int>(frame.width / 90));
    const Axis x_axis = linear_axis(x_lo, x_hi, x_target);
    auto px = [&](double x) { return frame.left + x_axis.fraction(x) * frame.width; };
    auto py = [&](double y) { return frame.bottom() - y_axis.fraction(y) * frame.height; };

    // Grid lines first, so that the curves are drawn over them.
    fmt::format_to(out, "<g class=\"grid\" stroke=\"#e5e5e5\" stroke-width=\"1\">\n");
    for (double t : x_axis.ticks) {
      fmt::format_to(out, "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n", px(t), frame.top,
                     frame.bottom());
    }
    for (double t : y_axis.ticks) {
      fmt::format_to(out, "<line x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\"/>\n", py(t), frame.left,
                     frame.right());
    }
    fmt::format_to(out, "</g>\n");

    // Tick marks outside the frame, and their labels.
    fmt::format_to(out, "<g class=\"ticks\" stroke=\"#444\" stroke-width=\"1\">\n");
    for (double t : x_axis.ticks) {
      fmt::format_to(out, "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n", px(t),
                     frame.bottom(), frame.bottom() + 5);
    }
    for (double t : y_axis.ticks) {
      fmt::format_to(out, "<line x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\"/>\n", py(t),
                     frame.left - 5, frame.left);
    }
    fmt::format_to(out, "</g>\n");
    for (double t : x_axis.ticks) {
      fmt::format_to(out, "<text class=\"xtick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", px(t),
                     frame.bottom() + 18, tick_label(t));
    }
    for (double t : y_axis.ticks) {
      fmt::format_to(out,
                     "<text class=\"ytick\" x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.35em\" text-anchor=\"end\">{}</text>\n",
                     frame.left - 8, py(t), tick_label(t));
    }

    for (size_t i = 0; i < series.size(); ++i) {
      if (drawn[i].empty()) continue;
      const std::string color =
          svg::xml_escape(series[i].color.empty() ? kPalette[i % kPalette.size()] : series[i].color);
      std::vector<Pixel> pixels;
      pixels.reserve(drawn[i].size());
      for (const auto& [x, y] : drawn[i]) pixels.push_back({px(x), py(y)});
      fmt::format_to(out,
                     "<polyline class=\"series\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" "
                     "stroke-linejoin=\"round\" points=\"",
                     color);
      std::pair<int64_t, int64_t> previous = {INT64_MIN, INT64_MIN};
      bool first = true;
      for (const Pixel& p : decimate(pixels)) {
        const auto rounded = tenths(p);
        if (rounded == previous) continue;
        fmt::format_to(out, "{}{:.1f},{:.1f}", first ? "" : " ", rounded.first / 10.0, rounded.second / 10.0);
        previous = rounded, first = false;
      }
      fmt::format_to(out, "\"/>\n");
      if (pixels.size() <= kMaxDottedPoints) {
        for (const Pixel& p : pixels) {
          fmt::format_to(out, "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", p.x, p.y, color);
        }
      }
    }
  } else {
    fmt::format_to(out,
                   "<text class=\"no-data\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#888\" "
                   "font-size=\"16\">no data</text>\n",
                   frame.left + frame.width / 2, frame.top + frame.height / 2);
  }
  fmt::format_to(out,
                 "<rect class=\"frame\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
                 "stroke=\"#444\"/>\n",
                 frame.left, frame.top, frame.width, frame.height);

  // Axis labels: x centred below the tick labels, y rotated along the left edge.
  if (!options.x_label.empty()) {
    fmt::format_to(out, "<text class=\"xlabel\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                   frame.left + frame.width / 2, h - 10.0, svg::xml_escape(options.x_label));
  }
  if (!options.y_label.empty()) {
    const double cy = frame.top + frame.height / 2;
    fmt::format_to(out,
                   "<text class=\"ylabel\" x=\"16\" y=\"{0:.1f}\" transform=\"rotate(-90 16 {0:.1f})\" "
                   "text-anchor=\"middle\">{1}</text>\n",
                   cy, svg::xml_escape(options.y_label));
  }

  // The legend: a boxed list in the top-right corner of the plot, one row per labelled series.
  std::vector<size_t> labelled;
  size_t longest = 0;
  for (size_t i = 0; i < series.size(); ++i) {
    if (series[i].label.empty()) continue;
    labelled.push_back(i);
    longest = std::max(longest, series[i].label.size());
  }
  if (!labelled.empty()) {
    constexpr double kRow = 18, kSample = 20;
    const double box_w = 8 + kSample + 6 + kCharWidth * static_cast<double>(longest) + 8;
    const double box_h = kRow * static_cast<double>(labelled.size()) + 8;
    const double box_x = frame.right() - box_w - 8, box_y = frame.top + 8;
    fmt::format_to(out, "<g class=\"legend\">\n");
    fmt::format_to(out,
                   "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"white\" "
                   "fill-opacity=\"0.85\" stroke=\"#bbb\"/>\n",
                   box_x, box_y, box_w, box_h);
    for (size_t row = 0; row < labelled.size(); ++row) {
      const size_t i = labelled[row];
      const std::string color =
          svg::xml_escape(series[i].color.empty() ? kPalette[i % kPalette.size()] : series[i].color);
      const double y = box_y + 4 + kRow * (static_cast<double>(row) + 0.5);
      fmt::format_to(out,
                     "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
                     "stroke-width=\"2\"/>\n",
                     box_x + 8, y, box_x + 8 + kSample, color);
      fmt::format_to(out, "<text x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.35em\">{}</text>\n", box_x + 8 + kSample + 6, y,
                     svg::xml_escape(series[i].label));
    }
    fmt::format_to(out, "</g>\n");
  }
  fmt::format_to(out, "</svg>\n");
  return fmt::to_string(buffer);
}

void write_loss_plot(const std::string& path, const std::vector<Series>& series, const PlotOptions& options) {
  write_file_atomically(path, loss_plot_svg(series, options), "write_loss_plot");
}

}  // namespace dtr::train
