// Test helpers shared by the test packages: an exception-message matcher, float64 views of
// tensors, seeded random inputs and indices, strided (non-contiguous) copies, per-dtype tolerances, and
// a comparison that checks the shape, then reports the op, dtype, shape, the first
// mismatching indices and the mismatch count.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "kernels/fill.h"
#include "kernels/random.h"

namespace dtr::testing {

// A fresh directory under the test's temporary directory ($TEST_TMPDIR, else /tmp), named
// `prefix` and a unique suffix.
inline std::filesystem::path make_temp_dir(const std::string& prefix) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string pattern = (std::filesystem::path(root != nullptr ? root : "/tmp") / (prefix + ".XXXXXX")).string();
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

// Matches an exception whose what() contains `part`; combine with && for several parts.
class MessageContains : public Catch::MatcherBase<std::exception> {
 public:
  explicit MessageContains(std::string part) : part_(std::move(part)) {}
  bool match(const std::exception& e) const override {
    return std::string_view(e.what()).find(part_) != std::string_view::npos;
  }
  std::string describe() const override { return "has a message containing \"" + part_ + "\""; }

 private:
  std::string part_;
};

// All elements in row-major order, as double, whatever the dtype and strides.
inline std::vector<double> to_f64(const Tensor& t) {
  Tensor c = t.to(kCPU).to(kFloat64).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// Uniform values in [lo, hi), rounded to dtype, from a seeded std::mt19937_64.
inline Tensor random_tensor(Shape shape, DType dtype, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Tensor f = Tensor::empty(std::move(shape), kFloat64);
  double* p = f.data_ptr<double>();
  for (int64_t i = 0; i < f.numel(); ++i) p[i] = dist(gen);
  if (!is_floating(dtype)) {
    for (int64_t i = 0; i < f.numel(); ++i) p[i] = std::floor(p[i]);
  }
  return f.to(dtype);
}

// Normal(0, 1) values drawn in float64 with normal_ (Philox, `seed`) and rounded to dtype.
inline Tensor random_normal(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, kFloat64);
  normal_(t, 0.0, 1.0, seed);
  return t.to(dtype);
}

// Uniform indices in [0, hi) of the given shape and (integer) dtype.
inline Tensor random_index(Shape shape, int64_t hi, DType dtype, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, std::max<int64_t>(hi - 1, 0));
  Tensor t = Tensor::empty(std::move(shape), kInt64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_ptr<int64_t>()[i] = dist(gen);
  return t.to(dtype);
}

// The same values as t, held in a non-contiguous view (every other element of a
// larger buffer along the last dim).
inline Tensor strided_copy(const Tensor& t) {
  if (t.dim() == 0) return t.clone();
  Shape big = t.shape();
  big.back() *= 2;
  Tensor buffer = zeros(big, t.dtype(), t.device());
  Tensor view = buffer.slice(-1, 0, big.back(), 2);
  view.copy_(t);
  return view;
}

struct Tolerance {
  double atol;
  double rtol;
};

inline Tolerance tolerance_for(DType d) {
  switch (d) {
    case kFloat64: return {1e-12, 1e-10};
    case kFloat32: return {1e-5, 1e-5};
    case kBFloat16: return {1e-2, 1.6e-2};
    case kFloat16: return {1e-3, 2e-3};
    default: return {0.0, 0.0};
  }
}

// Why actual is not close to `expected` (its shape, then its elements in row-major order),
// or "" when it is: a shape that differs, even with the same element count, or elements
// outside |a - e| <= atol + rtol * |e| (NaN matches NaN), the first ones named with the count.
inline std::string close_mismatch(const Tensor& actual, const Shape& expected_shape,
                                  const std::vector<double>& expected, Tolerance tol) {
  if (actual.shape() != expected_shape) {
    return fmt::format("{}: expected shape {}", describe(actual), expected_shape);
  }
  const std::vector<double> a = to_f64(actual);
  int64_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(expected[i]);
    const bool same_inf = std::isinf(a[i]) && a[i] == expected[i];
    if (both_nan || same_inf || std::abs(a[i] - expected[i]) <= tol.atol + tol.rtol * std::abs(expected[i])) continue;
    if (++mismatches <= 5) first += fmt::format("\n  [flat {}] expected {:.9g}, got {:.9g}", i, expected[i], a[i]);
  }
  if (mismatches == 0) return "";
  return fmt::format("{}: {} of {} elements differ (atol {}, rtol {}){}", describe(actual), mismatches, a.size(),
                     tol.atol, tol.rtol, first);
}

// Checks actual's shape and elements against the expected ones (close_mismatch).
inline void check_close(const Tensor& actual, const Shape& expected_shape, const std::vector<double>& expected,
                        Tolerance tol, const std::string& what) {
  REQUIRE(static_cast<int64_t>(expected.size()) == shape_numel(expected_shape));  // the test's own mistake
  const std::string mismatch = close_mismatch(actual, expected_shape, expected, tol);
  INFO(what << " " << mismatch);
  CHECK(mismatch.empty());
}

// With the tolerance of actual's dtype.
inline void check_close(const Tensor& actual, const Shape& expected_shape, const std::vector<double>& expected,
                        const std::string& what) {
  check_close(actual, expected_shape, expected, tolerance_for(actual.dtype()), what);
}

// Bit-exact comparison (for cases whose answer is exactly representable).
inline void check_equal(const Tensor& actual, const Shape& expected_shape, const std::vector<double>& expected,
                        const std::string& what) {
  check_close(actual, expected_shape, expected, Tolerance{0.0, 0.0}, what);
}

// The same against a reference tensor (any dtype, device and strides): its shape and values.
inline void check_close(const Tensor& actual, const Tensor& expected, Tolerance tol, const std::string& what) {
  check_close(actual, expected.shape(), to_f64(expected), tol, what);
}
inline void check_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  check_close(actual, expected.shape(), to_f64(expected), what);
}
inline void check_equal(const Tensor& actual, const Tensor& expected, const std::string& what) {
  check_equal(actual, expected.shape(), to_f64(expected), what);
}

inline constexpr DType kAllDTypes[] = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kBool};
inline constexpr DType kNumericDTypes[] = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64};  // all but bool
inline constexpr DType kFloatDTypes[] = {kFloat32, kFloat64, kBFloat16, kFloat16};
inline constexpr int64_t kAwkwardSizes[] = {0, 1, 7, 1023, 4097};

}  // namespace dtr::testing
