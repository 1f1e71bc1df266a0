// check_bitwise: two tensors of one shape and dtype, on any devices and at any strides, hold
// the same elements bit for bit (NaN payloads and the sign of zero included). On failure it
// reports what was compared, its dtype and shape, the first mismatching indices with both
// values and the mismatch count (the comparison of the CUDA kernels against the CPU's).
#pragma once

#include <catch2/catch.hpp>

#include <cstring>
#include <string>

#include "core/tensor.h"
#include "tests/testing/test_util.h"

namespace dtr::testing {

inline void check_bitwise(const Tensor& actual, const Tensor& expected, const std::string& what) {
  INFO(what << ": actual " << describe(actual) << ", expected " << describe(expected));
  REQUIRE(actual.shape() == expected.shape());
  REQUIRE(actual.dtype() == expected.dtype());
  const Tensor a = actual.to(kCPU).contiguous(), e = expected.to(kCPU).contiguous();
  const std::vector<double> av = to_f64(a), ev = to_f64(e);
  const auto* ab = static_cast<const char*>(a.numel() > 0 ? a.data() : nullptr);
  const auto* eb = static_cast<const char*>(e.numel() > 0 ? e.data() : nullptr);
  const size_t size = a.itemsize();
  int64_t mismatches = 0;
  std::string first;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(ab + i * size, eb + i * size, size) == 0) continue;
    if (++mismatches <= 5) {
      Shape index(a.dim());
      for (int64_t d = a.dim() - 1, rest = i; d >= 0; --d) {
        index[d] = rest % a.size(d);
        rest /= a.size(d);
      }
      first += fmt::format("\n  at {}: expected {:.17g}, got {:.17g}", index, ev[i], av[i]);
    }
  }
  INFO(mismatches << " of " << a.numel() << " elements differ" << first);
  CHECK(mismatches == 0);
}

}  // namespace dtr::testing
