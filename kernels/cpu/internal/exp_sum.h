// exp_sum: the max-subtracted sum of exponentials under softmax, log_softmax and
// cross_entropy on the CPU.
//
// For n values x[c * stride] it returns max = max_c x and sum = sum_c exp(x - max) (so
// log-sum-exp = max + log(sum) without overflow), in Acc, exp being exp_of (fast_exp for
// float); where exps is given it also stores each exp(x - max). Both are lane folds
// (lane_fold.h): one order fixed by the build, whatever the thread count, in loops that
// vectorise. A row of -inf gives NaN, as in torch; a NaN anywhere makes the sum NaN.
#pragma once

#include <cstdint>

#include "kernels/cpu/internal/lane_fold.h"
#include "kernels/cpu/internal/vec_math.h"

namespace dtr::cpu {

template <class Acc>
struct ExpSum {
  Acc max;
  Acc sum;
};

template <class Acc, class T, class Stride>
ExpSum<Acc> exp_sum(const T* x, int64_t n, Stride stride, Acc* exps = nullptr) {
  auto at = [&](int64_t c) { return static_cast<Acc>(x[c * stride]); };
  const Acc max = lane_max<Acc>(n, at);
  auto e = [&](int64_t c) { return exp_of(at(c) - max); };
  // Two loops, not one testing exps per element: GCC vectorises only the version of such a
  // loop that stores, and left the other scalar (cross_entropy ran at a fifth of its speed).
  if (exps == nullptr) return {max, lane_sum<Acc>(n, e)};
  return {max, lane_sum<Acc>(n, [&](int64_t c) { return exps[c] = e(c); })};
}

}  // namespace dtr::cpu
