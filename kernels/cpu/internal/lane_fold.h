// Lane folds (lane_sum, lane_max): folds over a row whose loops vectorise.
//
// A float sum written as `for (i) s += f(i)` cannot vectorise: reassociating it changes the
// result, and GCC keeps IEEE order. These keep kFoldBytes / sizeof(Acc) partial results
// (32 floats, 16 doubles) in lanes: element i goes to lane i % lanes, and the lanes are
// combined at the end in a fixed pairwise tree. Four vector accumulators (two on AVX-512)
// hide the adds' latency, which a single accumulator's sum waits on. The order of the
// additions depends on n alone: never on the thread count, the data or the vector width,
// so kernels built on them are bitwise reproducible run to run, on any number of threads,
// and on AVX2 and AVX-512 builds alike.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace dtr::cpu {

inline constexpr int kFoldBytes = 128;

// Combines lanes[0, kLanes) into lanes[0] pairwise: lane l with lane l + kLanes/2, and so on.
template <class Acc, int kLanes, class Op>
[[gnu::always_inline]] inline Acc fold_lanes(Acc (&lanes)[kLanes], const Op& op) {
#pragma GCC unroll 8
  for (int width = kLanes / 2; width > 0; width /= 2) {
#pragma omp simd
    for (int l = 0; l < width; ++l) lanes[l] = op(lanes[l], lanes[l + width]);
  }
  return lanes[0];
}

// Folds f(0), ..., f(n - 1) into lanes starting from `init`, then the lanes into one value.
template <class Acc, class F, class Op>
[[gnu::always_inline]] inline Acc lane_fold(int64_t n, Acc init, const F& f, const Op& op) {
  constexpr int kLanes = kFoldBytes / static_cast<int>(sizeof(Acc));
  Acc lanes[kLanes];
#pragma omp simd
  for (int l = 0; l < kLanes; ++l) lanes[l] = init;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) lanes[l] = op(lanes[l], f(i + l));
  }
  for (int l = 0; i < n; ++i, ++l) lanes[l] = op(lanes[l], f(i));
  return fold_lanes<Acc, kLanes>(lanes, op);
}

// sum over i in [0, n) of f(i), in Acc.
template <class Acc, class F>
[[gnu::always_inline]] inline Acc lane_sum(int64_t n, const F& f) {
  return lane_fold<Acc>(n, Acc(0), f, [](Acc a, Acc b) { return a + b; });
}

// max over i in [0, n) of f(i); -inf for n = 0.
template <class Acc, class F>
[[gnu::always_inline]] inline Acc lane_max(int64_t n, const F& f) {
  return lane_fold<Acc>(n, -std::numeric_limits<Acc>::infinity(), f, [](Acc a, Acc b) { return std::max(a, b); });
}

}  // namespace dtr::cpu
