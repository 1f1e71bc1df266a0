// Lane folds (lane_sum, lane_max): folds over a row whose loops vectorise.
//
// A float sum written as `for (i) s += f(i)` cannot vectorise: reassociating it changes the
// result, and GCC keeps IEEE order. These declare the fold an OpenMP SIMD reduction, which
// lets the compiler keep one partial result per vector lane in registers and combine the
// lanes at the end. The order of the additions is fixed by the build (its vector width),
// never by the thread count or the data, so kernels built on them stay bitwise
// reproducible run to run and on any number of threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace dtr::cpu {

// sum over i in [0, n) of f(i), in Acc.
template <class Acc, class F>
[[gnu::always_inline]] inline Acc lane_sum(int64_t n, const F& f) {
  Acc sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += f(i);
  return sum;
}

// max over i in [0, n) of f(i); -inf for n = 0.
template <class Acc, class F>
[[gnu::always_inline]] inline Acc lane_max(int64_t n, const F& f) {
  Acc max = -std::numeric_limits<Acc>::infinity();
#pragma omp simd reduction(max : max)
  for (int64_t i = 0; i < n; ++i) max = std::max(max, f(i));
  return max;
}

}  // namespace dtr::cpu
