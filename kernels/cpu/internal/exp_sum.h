// exp_sum: the max-subtracted sum of exponentials under softmax, log_softmax and
// cross_entropy on the CPU.
//
// For n values x[c * stride] it returns max = max_c x and sum = sum_c exp(x - max) (so
// log-sum-exp = max + log(sum) without overflow), accumulated in Acc in index order;
// where exps is given it also stores each exp(x - max). A row of -inf gives NaN, as in torch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dtr::cpu {

template <class Acc>
struct ExpSum {
  Acc max;
  Acc sum;
};

template <class Acc, class T, class Stride>
ExpSum<Acc> exp_sum(const T* x, int64_t n, Stride stride, Acc* exps = nullptr) {
  Acc max = -std::numeric_limits<Acc>::infinity();
  for (int64_t c = 0; c < n; ++c) max = std::max(max, static_cast<Acc>(x[c * stride]));
  Acc sum = 0;
  for (int64_t c = 0; c < n; ++c) {
    const Acc e = std::exp(static_cast<Acc>(x[c * stride]) - max);
    if (exps) exps[c] = e;
    sum += e;
  }
  return {max, sum};
}

}  // namespace dtr::cpu
