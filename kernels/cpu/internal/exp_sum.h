// exp_sum: the max-subtracted sum of exponentials under softmax, log_softmax and
// cross_entropy on the CPU.
//
// For n values x[c * stride] it returns max = max_c x and sum = sum_c exp(x - max) (so
// log-sum-exp = max + log(sum) without overflow), in Acc, exp being exp_of (fast_exp for
// float); where exps is given it also stores each exp(x - max). Both folds keep kLanes
// partial results, lane j taking c = j, j + kLanes, ... in order, combined in lane order:
// one fixed order, so the result never depends on the thread count, and loops that
// vectorise. A row of -inf gives NaN, as in torch; a NaN anywhere makes the sum NaN.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/internal/vec_math.h"

namespace dtr::cpu {

template <class Acc>
struct ExpSum {
  Acc max;
  Acc sum;
};

template <class Acc, class T, class Stride>
ExpSum<Acc> exp_sum(const T* x, int64_t n, Stride stride, Acc* exps = nullptr) {
  constexpr int64_t kLanes = 32;
  auto at = [&](int64_t c) { return static_cast<Acc>(x[c * stride]); };
  Acc lane[kLanes];
  std::fill_n(lane, kLanes, -std::numeric_limits<Acc>::infinity());
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = std::max(lane[j], at(c + j));
  }
  for (int64_t j = 0; c + j < n; ++j) lane[j] = std::max(lane[j], at(c + j));
  Acc max = lane[0];
  for (int64_t j = 1; j < kLanes; ++j) max = std::max(max, lane[j]);

  std::fill_n(lane, kLanes, Acc(0));
  for (c = 0; c + kLanes <= n; c += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const Acc e = exp_of(at(c + j) - max);
      if (exps) exps[c + j] = e;
      lane[j] += e;
    }
  }
  for (int64_t j = 0; c + j < n; ++j) {
    const Acc e = exp_of(at(c + j) - max);
    if (exps) exps[c + j] = e;
    lane[j] += e;
  }
  Acc sum = 0;
  for (int64_t j = 0; j < kLanes; ++j) sum += lane[j];
  return {max, sum};
}

}  // namespace dtr::cpu
