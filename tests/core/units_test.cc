// format_bytes and format_seconds: each unit at its boundaries, where rounding moves a value
// up to the next unit, and the clock style from a minute on.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>

#include "core/units.h"

namespace dtr {
namespace {

TEST_CASE("format_bytes: bytes, then binary units with one decimal", "[units]") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.0 KiB");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(1048524) == "1023.9 KiB");  // the last value that prints in KiB
  CHECK(format_bytes(1048525) == "1.0 MiB");     // would print as 1024.0 KiB
  CHECK(format_bytes(1048575) == "1.0 MiB");
  CHECK(format_bytes(int64_t{1} << 20) == "1.0 MiB");
  CHECK(format_bytes(12 * (int64_t{1} << 20)) == "12.0 MiB");
  CHECK(format_bytes((int64_t{1} << 30) - 1) == "1.0 GiB");
  CHECK(format_bytes(3 * (int64_t{1} << 30)) == "3.0 GiB");
  CHECK(format_bytes(int64_t{2} << 40) == "2.0 TiB");
  CHECK(format_bytes(std::numeric_limits<int64_t>::max()) == "8.0 EiB");
  CHECK(format_bytes(-1536) == "-1.5 KiB");
  CHECK(format_bytes(std::numeric_limits<int64_t>::min()) == "-8.0 EiB");
}

TEST_CASE("format_seconds: us, ms and s with three figures", "[units]") {
  CHECK(format_seconds(0) == "0.0 us");
  CHECK(format_seconds(12.5e-6) == "12.5 us");
  CHECK(format_seconds(301.2e-6) == "301.2 us");
  CHECK(format_seconds(999.9e-6) == "999.9 us");
  CHECK(format_seconds(999.96e-6) == "1.00 ms");  // would print as 1000.0 us
  CHECK(format_seconds(1e-3) == "1.00 ms");
  CHECK(format_seconds(1.23e-3) == "1.23 ms");
  CHECK(format_seconds(3.41e-3) == "3.41 ms");
  CHECK(format_seconds(0.999994) == "999.99 ms");
  CHECK(format_seconds(0.999996) == "1.00 s");
  CHECK(format_seconds(2) == "2.00 s");
  CHECK(format_seconds(59.99) == "59.99 s");
  CHECK(format_seconds(-1.5e-3) == "-1.50 ms");
}

TEST_CASE("format_seconds: a clock from a minute on", "[units]") {
  CHECK(format_seconds(59.996) == "1m00s");  // would print as 60.00 s
  CHECK(format_seconds(60) == "1m00s");
  CHECK(format_seconds(185) == "3m05s");
  CHECK(format_seconds(185.4) == "3m05s");
  CHECK(format_seconds(3599.4) == "59m59s");
  CHECK(format_seconds(3599.6) == "1h00m");
  CHECK(format_seconds(3600 + 2 * 60) == "1h02m");
  CHECK(format_seconds(3600 + 2 * 60 + 29) == "1h02m");  // to the nearest minute
  CHECK(format_seconds(3600 + 2 * 60 + 30) == "1h03m");
  CHECK(format_seconds(30 * 3600) == "30h00m");
}

TEST_CASE("mib: bytes as MiB for table columns", "[units]") {
  CHECK(mib(3 * 1048576.0) == 3.0);
  CHECK(mib(0) == 0.0);
}

}  // namespace
}  // namespace dtr
