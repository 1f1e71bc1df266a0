// Loss curves as a standalone SVG 1.1 line chart: one polyline per series over a grid at
// "nice" ticks (1, 2 or 5 x 10^k, Heckbert's Graphics Gems rule), a legend and the title.
//
// Points are (step, value) in data units. Non-finite points (and, on a log axis, values <= 0)
// are skipped, so a NaN loss leaves a gap-free line and never reaches the file. Each polyline
// keeps at most four points per pixel column (the first, lowest, highest and last: M4
// decimation), so the file grows with the chart's width, not the number of steps, and every
// spike stays visible. A series of at most 50 points also gets a dot per point (sparse
// validation losses). Text is XML-escaped; nothing to draw gives a "no data" chart.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtr::train {

// One curve: its legend label, an SVG colour ("" picks one from a palette) and its points.
struct Series {
  std::string label;
  std::string color;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

struct PlotOptions {
  std::string title;
  std::string x_label = "step";
  std::string y_label = "loss";
  int width = 800, height = 480;  // pixels, at least 160 x 120
  bool log_y = false;             // a log10 value axis
};

// An SVG line chart of the series (axes with ticks at round numbers, grid lines, a legend,
// the title), as text. ValueError when the size is out of range.
std::string loss_plot_svg(const std::vector<Series>& series, const PlotOptions& options);

// Writes loss_plot_svg(...) to `path` atomically (path + ".tmp", then a rename), so a reader
// never sees half a file; OSError naming the path and the failed call on failure.
void write_loss_plot(const std::string& path, const std::vector<Series>& series, const PlotOptions& options);

}  // namespace dtr::train
