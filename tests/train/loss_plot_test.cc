// Loss plots, checked on the SVG text: a standalone SVG 1.1 document, a polyline per series
// that has points, escaped labels, nice ticks for known ranges (linear and log), the awkward
// inputs (no series, one point, a flat curve, NaN and inf), the size bound for long runs,
// and the atomic write with its OSError. Where xmllint is installed it also checks that each
// chart is well-formed XML.
#include "tools/train/loss_plot.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/testing/svg_text.h"
#include "tests/testing/test_util.h"

namespace dtr::train {
namespace {

namespace fs = std::filesystem;
using testing::MessageContains;
using testing::texts_of_class;

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

// The (x, y) pixels of each polyline. (Found by hand: libstdc++'s recursive std::regex
// overflows the stack on a points attribute of thousands of points.)
std::vector<std::vector<std::pair<double, double>>> polyline_points(const std::string& svg) {
  std::vector<std::vector<std::pair<double, double>>> out;
  for (size_t at = svg.find("<polyline "); at != std::string::npos; at = svg.find("<polyline ", at + 1)) {
    const size_t begin = svg.find("points=\"", at) + 8, end = svg.find('"', begin);
    std::istringstream points(svg.substr(begin, end - begin));
    std::vector<std::pair<double, double>> one;
    double x, y;
    char comma;
    while (points >> x >> comma >> y) one.emplace_back(x, y);
    out.push_back(std::move(one));
  }
  return out;
}

// The number of points in each polyline.
std::vector<size_t> polyline_sizes(const std::string& svg) {
  std::vector<size_t> out;
  for (const auto& points : polyline_points(svg)) out.push_back(points.size());
  return out;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Checks with xmllint that `svg` is well-formed XML, where xmllint is installed.
void check_well_formed(const std::string& svg, const std::string& name) {
  if (std::system("command -v xmllint > /dev/null 2>&1") != 0) {
    WARN("xmllint is not installed: " << name << " is not checked for well-formedness");
    return;
  }
  const fs::path path = testing::make_temp_dir("loss_plot_xml") / (name + ".svg");
  std::ofstream(path, std::ios::binary) << svg;
  INFO(name << ":\n" << svg.substr(0, 2000));
  CHECK(std::system(("xmllint --noout '" + path.string() + "'").c_str()) == 0);
}

Series line(std::string label, std::vector<std::pair<double, double>> points) {
  return Series{std::move(label), "", std::move(points)};
}

TEST_CASE("loss_plot_svg: a standalone SVG 1.1 document with the title, axis labels and legend", "[loss_plot]") {
  const std::string svg = loss_plot_svg({line("train", {{0, 4.0}, {100, 3.0}, {200, 2.5}})},
                                        {.title = "run 7", .width = 640, .height = 400});
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("xmlns=\"http://www.w3.org/2000/svg\"") != std::string::npos);
  CHECK(svg.find("version=\"1.1\"") != std::string::npos);
  CHECK(svg.find("viewBox=\"0 0 640 400\"") != std::string::npos);
  CHECK(svg.size() >= 7);
  CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
  CHECK(texts_of_class(svg, "title") == std::vector<std::string>{"run 7"});
  CHECK(texts_of_class(svg, "xlabel") == std::vector<std::string>{"step"});
  CHECK(texts_of_class(svg, "ylabel") == std::vector<std::string>{"loss"});
  CHECK(svg.find(">train</text>") != std::string::npos);
  check_well_formed(svg, "basic");
}

TEST_CASE("loss_plot_svg: one polyline per series with points, every series in the legend", "[loss_plot]") {
  const std::string svg = loss_plot_svg(
      {line("train", {{0, 3}, {1, 2}, {2, 1.5}}), line("empty", {}), line("val", {{0, 3.1}, {2, 1.8}})}, {});
  CHECK(count(svg, "<polyline") == 2);
  CHECK(polyline_sizes(svg) == std::vector<size_t>{3, 2});
  CHECK(svg.find(">train</text>") != std::string::npos);
  CHECK(svg.find(">empty</text>") != std::string::npos);
  CHECK(svg.find(">val</text>") != std::string::npos);
  // Colours from the palette, in series order, unless a series names its own.
  CHECK(svg.find("stroke=\"#1f77b4\"") != std::string::npos);
  CHECK(svg.find("stroke=\"#2ca02c\"") != std::string::npos);
  const std::string red = loss_plot_svg({Series{"a", "red", {{0, 1}, {1, 2}}}}, {});
  CHECK(red.find("<polyline class=\"series\" fill=\"none\" stroke=\"red\"") != std::string::npos);
}

TEST_CASE("loss_plot_svg: labels, title and colours are XML-escaped", "[loss_plot]") {
  const std::string svg = loss_plot_svg({Series{"train & <val> \"q\" 'a'", "\"><x", {{0, 1}, {1, 2}}}},
                                        {.title = "a<b & c>d", .x_label = "tokens <M>", .y_label = "x & y"});
  CHECK(svg.find("train &amp; &lt;val&gt; &quot;q&quot; &apos;a&apos;") != std::string::npos);
  CHECK(svg.find("a&lt;b &amp; c&gt;d") != std::string::npos);
  CHECK(svg.find("tokens &lt;M&gt;") != std::string::npos);
  CHECK(svg.find("x &amp; y") != std::string::npos);
  CHECK(svg.find("&quot;&gt;&lt;x") != std::string::npos);
  CHECK(svg.find("<val>") == std::string::npos);
  CHECK(svg.find("<b") == std::string::npos);
  CHECK(svg.find("<x") == std::string::npos);
  CHECK(svg.find("<M>") == std::string::npos);
  check_well_formed(svg, "escaped");
}

TEST_CASE("loss_plot_svg: ticks at round numbers for a known range", "[loss_plot]") {
  SECTION("0..10 ticks every 2 on both axes") {
    const std::string svg = loss_plot_svg({line("a", {{0, 0}, {5, 7}, {10, 10}})}, {});
    const std::vector<std::string> evens = {"0", "2", "4", "6", "8", "10"};
    CHECK(texts_of_class(svg, "xtick") == evens);
    CHECK(texts_of_class(svg, "ytick") == evens);
  }
  SECTION("an awkward range widens to whole steps of 1, 2 or 5 x 10^k, with no rounding noise") {
    const std::string svg = loss_plot_svg({line("a", {{3, 0.0137}, {9871, 0.0862}})}, {});
    CHECK(texts_of_class(svg, "ytick") ==
          std::vector<std::string>{"0.01", "0.02", "0.03", "0.04", "0.05", "0.06", "0.07", "0.08", "0.09"});
    CHECK(texts_of_class(svg, "xtick") == std::vector<std::string>{"0", "2000", "4000", "6000", "8000", "10000"});
  }
  SECTION("tenths print as tenths") {
    const std::string svg = loss_plot_svg({line("a", {{0, 0.1}, {1, 0.7}})}, {});
    CHECK(texts_of_class(svg, "ytick") == std::vector<std::string>{"0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7"});
  }
  SECTION("negative values") {
    const std::string svg = loss_plot_svg({line("a", {{0, -10}, {1, 10}})}, {});
    CHECK(texts_of_class(svg, "ytick") == std::vector<std::string>{"-10", "-5", "0", "5", "10"});
  }
}

TEST_CASE("loss_plot_svg: the left margin grows with the widest y tick label", "[loss_plot]") {
  // Tick labels are right-aligned at their x; at about 7 px a character each must start right
  // of the rotated y label (x = 16, about 12 px wide), and the last x label must end inside.
  for (const auto& [lo, hi] : std::vector<std::pair<double, double>>{{0.00011, 0.00019}, {-1.5e6, 2.5e6}, {0, 1}}) {
    const std::string svg = loss_plot_svg({line("a", {{0, lo}, {20000, hi}})}, {});
    const std::regex element("<text class=\"ytick\" x=\"([0-9.]+)\"[^>]*>([^<]*)</text>");
    size_t n = 0;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), element); it != std::sregex_iterator(); ++it, ++n) {
      INFO("tick " << (*it)[2].str() << " at x " << (*it)[1].str());
      CHECK(std::stod((*it)[1].str()) - 7.0 * static_cast<double>((*it)[2].length()) >= 22);
    }
    CHECK(n >= 3);
    const std::regex last_x("<text class=\"xtick\" x=\"([0-9.]+)\"[^>]*>20000</text>");
    std::smatch match;
    REQUIRE(std::regex_search(svg, match, last_x));
    CHECK(std::stod(match[1].str()) + 7.0 * 5 / 2 <= 800);
  }
}

TEST_CASE("loss_plot_svg: a log axis ticks at decades, or at 1, 2, 5 within few decades", "[loss_plot]") {
  SECTION("four decades") {
    const std::string svg = loss_plot_svg({line("a", {{0, 100}, {1, 3}, {2, 0.01}})}, {.title = "", .log_y = true});
    CHECK(texts_of_class(svg, "ytick") == std::vector<std::string>{"0.01", "0.1", "1", "10", "100"});
  }
  SECTION("just over a decade") {
    const std::string svg = loss_plot_svg({line("a", {{0, 40}, {1, 2.5}})}, {.title = "", .log_y = true});
    CHECK(texts_of_class(svg, "ytick") == std::vector<std::string>{"2", "5", "10", "20", "50"});
  }
  SECTION("within a decade") {
    const std::string svg = loss_plot_svg({line("a", {{0, 3.9}, {1, 2.5}})}, {.title = "", .log_y = true});
    CHECK(texts_of_class(svg, "ytick") == std::vector<std::string>{"2", "3", "4"});
  }
  SECTION("values <= 0 are left out") {
    const std::string svg =
        loss_plot_svg({line("a", {{0, 10}, {1, 0}, {2, -1}, {3, 1}})}, {.title = "", .log_y = true});
    CHECK(polyline_sizes(svg) == std::vector<size_t>{2});
    CHECK(texts_of_class(svg, "ytick") == std::vector<std::string>{"1", "2", "5", "10"});
  }
}

TEST_CASE("loss_plot_svg: nothing to draw gives a 'no data' chart", "[loss_plot]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& series : std::vector<std::vector<Series>>{{}, {line("a", {})}, {line("a", {{nan, 1}, {2, nan}})}}) {
    const std::string svg = loss_plot_svg(series, {.title = "empty"});
    CHECK(svg.rfind("<svg", 0) == 0);
    CHECK(texts_of_class(svg, "no-data") == std::vector<std::string>{"no data"});
    CHECK(count(svg, "<polyline") == 0);
    CHECK(svg.find("nan") == std::string::npos);
    check_well_formed(svg, "no_data");
  }
}

TEST_CASE("loss_plot_svg: one point, and a flat curve, get a padded range", "[loss_plot]") {
  SECTION("one point: a polyline of one point and its dot") {
    const std::string svg = loss_plot_svg({line("a", {{5, 2.5}})}, {});
    CHECK(polyline_sizes(svg) == std::vector<size_t>{1});
    CHECK(count(svg, "<circle") == 1);
    CHECK(texts_of_class(svg, "xtick").size() >= 2);
    CHECK(texts_of_class(svg, "ytick").size() >= 2);
    CHECK(svg.find("nan") == std::string::npos);
    CHECK(svg.find("inf") == std::string::npos);
  }
  for (double v : {0.0, 3.0, -2.0, 1e-6}) {
    SECTION("equal values " + std::to_string(v)) {
      const std::string svg = loss_plot_svg({line("a", {{0, v}, {1, v}, {2, v}})}, {});
      const std::vector<std::string> ticks = texts_of_class(svg, "ytick");
      REQUIRE(ticks.size() >= 3);
      CHECK(std::stod(ticks.front()) < v);
      CHECK(std::stod(ticks.back()) > v);
      CHECK(svg.find("nan") == std::string::npos);
    }
  }
  SECTION("equal values on a log axis") {
    const std::string svg = loss_plot_svg({line("a", {{0, 3}, {1, 3}})}, {.title = "", .log_y = true});
    const std::vector<std::string> ticks = texts_of_class(svg, "ytick");
    REQUIRE(ticks.size() >= 3);
    CHECK(std::stod(ticks.front()) < 3);
    CHECK(std::stod(ticks.back()) > 3);
  }
}

TEST_CASE("loss_plot_svg: NaN and inf points are skipped and never reach the file", "[loss_plot]") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::string svg =
      loss_plot_svg({line("a", {{0, 3}, {1, nan}, {2, 2}, {3, inf}, {4, -inf}, {nan, 1}, {inf, 1}, {5, 1.5}})}, {});
  CHECK(polyline_sizes(svg) == std::vector<size_t>{3});
  CHECK(count(svg, "<circle") == 3);
  std::string lower = svg;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  CHECK(lower.find("nan") == std::string::npos);
  CHECK(lower.find("inf") == std::string::npos);
  CHECK(texts_of_class(svg, "xtick").back() == "5");
  check_well_formed(svg, "nan");
}

TEST_CASE("loss_plot_svg: dots only on sparse series", "[loss_plot]") {
  std::vector<std::pair<double, double>> fifty, fifty_one;
  for (int i = 0; i < 51; ++i) {
    if (i < 50) fifty.emplace_back(i, 1.0 / (i + 1));
    fifty_one.emplace_back(i, 1.0 / (i + 1));
  }
  CHECK(count(loss_plot_svg({line("val", fifty)}, {}), "<circle") == 50);
  CHECK(count(loss_plot_svg({line("val", fifty_one)}, {}), "<circle") == 0);
}

TEST_CASE("loss_plot_svg: 20k noisy points per series stay under 200 KB and keep their extremes", "[loss_plot]") {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> noise(-0.5, 0.5);
  std::vector<Series> series;
  for (int s = 0; s < 3; ++s) {
    Series one{"run " + std::to_string(s), "", {}};
    for (int step = 0; step < 20000; ++step) one.points.emplace_back(step, 10.0 / (1 + step * 0.01) + noise(gen));
    series.push_back(std::move(one));
  }
  series[0].points[12345].second = 42.0;  // one spike, which decimation must keep
  const std::string svg = loss_plot_svg(series, {});
  INFO("size " << svg.size());
  CHECK(svg.size() < 200 * 1024);
  CHECK(count(svg, "<polyline") == 3);
  CHECK(count(svg, "<circle") == 0);
  for (size_t n : polyline_sizes(svg)) CHECK(n <= 4 * 800);
  // The spike is the highest point of the first polyline, where the axis puts 42. The plot
  // area of an untitled 800 x 480 chart spans y = 16..432.
  const std::vector<std::string> ticks = texts_of_class(svg, "ytick");
  const double lo = std::stod(ticks.front()), hi = std::stod(ticks.back());
  const std::vector<std::pair<double, double>> first = polyline_points(svg).front();
  double top = INFINITY;
  for (const auto& [x, y] : first) top = std::min(top, y);
  CHECK(top == Approx(432 - (42 - lo) / (hi - lo) * 416).margin(0.06));
  check_well_formed(svg, "large");
}

TEST_CASE("loss_plot_svg: a chart too small to draw is a ValueError", "[loss_plot][errors]") {
  CHECK_THROWS_MATCHES(loss_plot_svg({}, {.title = "", .width = 10}), ValueError,
                       MessageContains("loss_plot_svg") && MessageContains("10 x 480"));
  CHECK_THROWS_AS(loss_plot_svg({}, {.title = "", .height = 0}), ValueError);
  CHECK_THROWS_AS(loss_plot_svg({}, {.title = "", .width = 100000}), ValueError);
}

TEST_CASE("write_loss_plot: writes the chart atomically; a path it cannot write is an OSError naming it",
          "[loss_plot][errors]") {
  const fs::path dir = testing::make_temp_dir("loss_plot_test");
  const fs::path path = dir / "loss.svg";
  const std::vector<Series> series = {line("train", {{0, 3}, {1, 2}})};
  write_loss_plot(path.string(), series, {.title = "t"});
  CHECK(read_file(path) == loss_plot_svg(series, {.title = "t"}));
  CHECK_FALSE(fs::exists(dir / "loss.svg.tmp"));

  // Rewriting replaces the file.
  write_loss_plot(path.string(), {}, {});
  CHECK(read_file(path) == loss_plot_svg({}, {}));

  const fs::path missing = dir / "no_such_dir" / "loss.svg";
  CHECK_THROWS_MATCHES(write_loss_plot(missing.string(), series, {}), OSError,
                       MessageContains("write_loss_plot: open(") && MessageContains(missing.string()) &&
                           MessageContains("No such file"));
  // A failed write leaves the old file as it was.
  const std::string before = read_file(path);
  fs::create_directory(dir / "loss.svg.tmp");
  CHECK_THROWS_MATCHES(write_loss_plot(path.string(), series, {}), OSError, MessageContains("loss.svg.tmp"));
  CHECK(read_file(path) == before);
}

}  // namespace
}  // namespace dtr::train
