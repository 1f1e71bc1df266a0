// CPU threading for dtr's kernels: one thread count, set by the caller, used everywhere.
//
// Ranks are processes, so the default is 1 thread per rank; set_num_threads(n) raises it
// for every CPU kernel, Eigen's GEMM included. parallel_for splits [0, n) into at most
// num_threads() contiguous chunks; dtr's kernels compute each output element by one fixed
// sequence of operations, so their results are bitwise the same on any thread count
// (Eigen's GEMM blocking may change with it: matmul agrees only to rounding). Bodies must
// not throw: validate first. (ATen's at::parallel_for and at::set_num_threads, on OpenMP.)
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace dtr {

// Sets the number of threads CPU kernels use (>= 1), or throws ValueError.
void set_num_threads(int n);
// The number of threads CPU kernels use (1 unless set_num_threads said otherwise).
int num_threads();

// Calls f(begin, end) on disjoint chunks covering [0, n), each of at least `grain`
// elements (but the last), on up to num_threads() threads; inline inside a parallel region.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  const int64_t g = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::min<int64_t>(num_threads(), (n + g - 1) / g);
  if (chunks <= 1 || omp_in_parallel()) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t chunk = (n + chunks - 1) / chunks;
#pragma omp parallel for num_threads(static_cast <int>(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * chunk;
    const int64_t end = std::min(n, begin + chunk);
    if (begin < end) f(begin, end);
  }
}

}  // namespace dtr
