// Lane folds (lane_sum, lane_max): folds over a row whose loops vectorise, in one fixed order.
//
// A float sum written as `for (i) s += f(i)` cannot vectorise (reassociating it would change
// the result, and GCC keeps IEEE order). These keep kLanes partial results instead: lane j
// folds i = j, j + kLanes, j + 2 kLanes, ... in order, and the lanes are combined in lane
// order at the end. The order depends only on n, never on the thread count, so a kernel
// built on them stays bitwise reproducible. (The same scheme as reduce.cc's partials.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace dtr::cpu {

inline constexpr int64_t kFoldLanes = 32;

// sum over i in [0, n) of f(i), in Acc.
template <class Acc, class F>
[[gnu::always_inline]] inline Acc lane_sum(int64_t n, const F& f) {
  Acc lane[kFoldLanes] = {};
  int64_t i = 0;
  for (; i + kFoldLanes <= n; i += kFoldLanes) {
    for (int64_t j = 0; j < kFoldLanes; ++j) lane[j] += f(i + j);
  }
  for (int64_t j = 0; i + j < n; ++j) lane[j] += f(i + j);
  Acc sum = 0;
  for (int64_t j = 0; j < kFoldLanes; ++j) sum += lane[j];
  return sum;
}

// max over i in [0, n) of f(i) as std::max folds it (a NaN is skipped unless it comes
// first); -inf for n = 0.
template <class Acc, class F>
[[gnu::always_inline]] inline Acc lane_max(int64_t n, const F& f) {
  Acc lane[kFoldLanes];
  std::fill_n(lane, kFoldLanes, -std::numeric_limits<Acc>::infinity());
  int64_t i = 0;
  for (; i + kFoldLanes <= n; i += kFoldLanes) {
    for (int64_t j = 0; j < kFoldLanes; ++j) lane[j] = std::max(lane[j], f(i + j));
  }
  for (int64_t j = 0; i + j < n; ++j) lane[j] = std::max(lane[j], f(i + j));
  Acc max = lane[0];
  for (int64_t j = 1; j < kFoldLanes; ++j) max = std::max(max, lane[j]);
  return max;
}

}  // namespace dtr::cpu
