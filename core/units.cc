#include "core/units.h"

#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace dtr {

std::string format_bytes(int64_t bytes) {
  const char* sign = bytes < 0 ? "-" : "";
  const uint64_t magnitude = bytes < 0 ? 0 - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
  if (magnitude < 1024) return fmt::format("{}{} B", sign, magnitude);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(magnitude) / 1024;
  int unit = 0;
  // Move up while the value would print as 1024.0 or more.
  while (unit + 1 < 6 && std::round(value * 10) >= 1024 * 10) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{}{:.1f} {}", sign, value, kUnits[unit]);
}

std::string format_seconds(double seconds) {
  if (std::signbit(seconds) && seconds != 0) return "-" + format_seconds(-seconds);
  if (!std::isfinite(seconds)) return fmt::format("{} s", seconds);
  // Each unit holds the values that print as less than 1000 of it (60 for seconds): tenths of
  // a microsecond, hundredths of a millisecond and of a second.
  if (std::round(seconds * 1e7) < 1e4) return fmt::format("{:.1f} us", seconds * 1e6);
  if (std::round(seconds * 1e5) < 1e5) return fmt::format("{:.2f} ms", seconds * 1e3);
  if (std::round(seconds * 1e2) < 60e2) return fmt::format("{:.2f} s", seconds);
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  const int64_t m = (s + 30) / 60;  // to the nearest minute
  return fmt::format("{}h{:02d}m", m / 60, m % 60);
}

}  // namespace dtr
