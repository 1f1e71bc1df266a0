// Sizes and durations as people read them, in one style for every table, log line and error
// message: binary byte units ("512 B", "1.5 KiB", "12.0 MiB", "3.0 GiB") and durations that
// keep three significant figures below a minute ("12.5 us", "3.41 ms", "2.00 s") and read as
// a clock from a minute on ("3m05s", "1h02m").
//
// A value takes the unit it prints in after rounding: 1048575 bytes is "1.0 MiB", not
// "1024.0 KiB", and 0.99999 s is "1.00 s". Negative values print with a minus sign.
#pragma once

#include <cstdint>
#include <string>

namespace dtr {

// "512 B", "1.5 KiB", "12.0 MiB", "3.0 GiB", "2.0 TiB".
std::string format_bytes(int64_t bytes);

// "12.5 us", "3.41 ms", "2.00 s", then "3m05s" from a minute and "1h02m" from an hour.
std::string format_seconds(double seconds);

// Bytes as a number of MiB, for table columns headed "MiB".
constexpr double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace dtr
