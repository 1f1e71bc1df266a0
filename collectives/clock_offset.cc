#include "collectives/clock_offset.h"

#include <fmt/format.h>

#include <limits>

#include "core/trace.h"

namespace dtr {

ClockOffset measure_clock_offset(Store& store, int rank, int size, const std::string& prefix, int rounds) {
  const auto key = [&](int r, int round, const char* what) {
    return fmt::format("{}/{}/{}/{}", prefix, r, round, what);
  };
  if (rank == 0) {
    for (int r = 1; r < size; ++r) {
      for (int round = 0; round < rounds; ++round) {
        store.get(key(r, round, "ping"), store.timeout());
        store.set(key(r, round, "pong"), std::to_string(trace::now_ns()));
      }
    }
    return {};
  }
  ClockOffset best{0, std::numeric_limits<int64_t>::max()};
  for (int round = 0; round < rounds; ++round) {
    const int64_t t1 = trace::now_ns();
    store.set(key(rank, round, "ping"), "");
    const int64_t t0 = std::stoll(store.get(key(rank, round, "pong"), store.timeout()));
    const int64_t t2 = trace::now_ns();
    if (t2 - t1 < best.round_trip_ns) best = {t0 - (t1 + (t2 - t1) / 2), t2 - t1};
  }
  return best;
}

}  // namespace dtr
