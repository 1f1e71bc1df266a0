// exp_sum: the max-subtracted sum of exponentials under softmax, log_softmax and
// cross_entropy on the CPU.
//
// For n values x[c * stride] it returns max = max_c x and sum = sum_c exp(x - max) (so
// log-sum-exp = max + log(sum) without overflow), in Acc, exp being exp_nonpositive_of
// (x - max <= 0: fast_exp_nonpositive for float); where exps is given it also stores each
// exp(x - max). Both are lane folds (lane_fold.h): one order fixed by n alone, whatever
// the thread count or vector width, in loops that vectorise. A row of -inf gives NaN, as
// in torch; a NaN anywhere makes the sum NaN.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/cpu/prefetch.h"
#include "kernels/cpu/internal/lane_fold.h"
#include "kernels/cpu/internal/vec_math.h"

namespace dtr::cpu {

template <class Acc>
struct ExpSum {
  Acc max;
  Acc sum;
};

// Elements per chunk of the exp pass (1 KiB of float32).
inline constexpr int64_t kExpChunk = 256;

// The exp pass goes over the row in chunks of kExpChunk elements, summed in order. Where
// next is given (the row after this one, contiguous, of n elements) each chunk first asks
// for the matching part of next (prefetch.h), so that its max pass finds it in L2.
template <class Acc, class T, class Stride>
ExpSum<Acc> exp_sum(const T* x, int64_t n, Stride stride, Acc* exps = nullptr, const T* next = nullptr) {
  auto at = [&](int64_t c) { return static_cast<Acc>(x[c * stride]); };
  const Acc max = lane_max<Acc>(n, at);
  Acc sum = 0;
  for (int64_t c0 = 0; c0 < n; c0 += kExpChunk) {
    const int64_t m = std::min(kExpChunk, n - c0);
    if (next != nullptr) prefetch_to_l2(next + c0, m * static_cast<int64_t>(sizeof(T)));
    auto e = [&](int64_t c) { return exp_nonpositive_of(at(c0 + c) - max); };
    // Two loops, not one testing exps per element: GCC vectorises only the version of such
    // a loop that stores and leaves the other scalar, which cross_entropy's fold uses.
    if (exps == nullptr) {
      sum += lane_sum<Acc>(m, e);
    } else {
      sum += lane_sum<Acc>(m, [&](int64_t c) { return exps[c0 + c] = e(c); });
    }
  }
  return {max, sum};
}

}  // namespace dtr::cpu
