// Helpers for collective tests: rank-dependent tensors whose reductions have closed forms,
// strided copies, and a bit-exact comparison that names the first mismatches.
//
// Every value used is a small integer (or a half or quarter of one), so sums over up to
// four ranks are exact in every dtype, bfloat16 included, and results compare bit for bit.
#pragma once

#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/fill.h"
#include "tests/testing/test_util.h"

namespace dtr::testing {

inline constexpr auto& kCollectiveDTypes = kNumericDTypes;  // collectives move every dtype but bool
inline constexpr auto& kCollectiveSizes = kAwkwardSizes;    // 0, 1, 7, 1023, 4097

// A [rows, cols] tensor (1-D when cols == 0) holding f(flat index), in dtype.
inline Tensor make_tensor(int64_t rows, int64_t cols, DType dtype, const std::function<double(int64_t)>& f) {
  const int64_t n = rows * (cols == 0 ? 1 : cols);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = f(i);
  Shape shape = cols == 0 ? Shape{rows} : Shape{rows, cols};
  return Tensor::from_vector(v, shape).to(dtype);
}

// t's values in a non-contiguous view: every other element of a buffer twice as wide.
inline Tensor strided_copy_of(const Tensor& t) {
  Shape big = t.shape();
  big.back() *= 2;
  Tensor buffer = full(big, -99.0, t.dtype());
  Tensor view = buffer.slice(-1, 0, big.back(), 2);
  view.copy_(t);
  return view;
}

// Bit-exact comparison with the first five mismatches and their count.
inline void check_exact(const Tensor& actual, const std::vector<double>& expected, const std::string& what) {
  const std::vector<double> a = to_f64(actual);
  REQUIRE(a.size() == expected.size());
  int64_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == expected[i]) continue;
    if (++mismatches <= 5) first += fmt::format("\n  [flat {}] expected {}, got {}", i, expected[i], a[i]);
  }
  INFO(what << " " << describe(actual) << ": " << mismatches << " of " << a.size() << " elements differ" << first);
  CHECK(mismatches == 0);
}

}  // namespace dtr::testing
