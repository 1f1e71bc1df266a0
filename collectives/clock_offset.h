// How far each rank's clock is from rank 0's, so that traces of several processes (or
// machines) share one time axis.
//
// NTP's idea through the store: rank r notes t1 and posts a ping; rank 0, which waits for
// it, answers with its clock t0; rank r reads the answer at t2. Rank 0's t0 lies in [t1, t2]
// of rank r's clock, so t0 - (t1 + t2) / 2 is rank 0's clock minus rank r's within half the
// round trip; of several rounds the one with the shortest round trip is kept. Rank 0 serves
// the other ranks one after another.
#pragma once

#include <cstdint>
#include <string>

#include "collectives/store.h"

namespace dtr {

struct ClockOffset {
  int64_t offset_ns = 0;      // rank 0's clock minus this rank's (0 on rank 0)
  int64_t round_trip_ns = 0;  // of the round kept: the offset is good to half of it
};

// Collective over ranks 0..size-1 of `store` (every rank calls it with the same `prefix`,
// unique per measurement); the clock is trace::now_ns()'s. A rank that does not come is a
// DistributedError(kTimeout) from the store after its timeout.
ClockOffset measure_clock_offset(Store& store, int rank, int size, const std::string& prefix, int rounds = 8);

}  // namespace dtr
