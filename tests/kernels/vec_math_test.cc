// fast_exp and fast_exp_nonpositive against exp in float64, over a sample of every float
// bit pattern in their ranges (every 61st, about 18 million values) and every float at
// fast_exp_nonpositive's flush boundary: within 0.94 ulp where the result is normal; fast_exp
// within one subnormal step below that, fast_exp_nonpositive within one step at the edge and
// 0 beyond; the special values exactly, NaNs of any payload staying NaN.
#include "kernels/cpu/internal/vec_math.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

namespace dtr::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kSmallestNormal = 0x1p-126;

// The largest error, in ulps of the float result, of exp_f over floats whose bits run from
// `from` to `to` (inclusive, step 61); results below the smallest normal float are checked
// by below_normal(got, exact) instead.
template <class Exp, class Below>
double max_ulp_error(uint32_t from, uint32_t to, const Exp& exp_f, const Below& below_normal) {
  double worst = 0;
  int64_t misses = 0;
  for (uint64_t b = from; b <= to; b += 61) {
    const float x = bits_float(static_cast<uint32_t>(b));
    const float got = exp_f(x);
    const double exact = std::exp(static_cast<double>(x));
    if (exact < kSmallestNormal) {
      misses += !below_normal(got, exact);
      continue;
    }
    if (exact >= std::numeric_limits<float>::max()) {
      misses += got != kInf;
      continue;
    }
    const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(exact)) - 23);
    worst = std::max(worst, std::abs(got - exact) / ulp);
  }
  CHECK(misses == 0);
  return worst;
}

TEST_CASE("fast_exp is within 0.94 ulp and exact at the extremes", "[vec_math]") {
  auto subnormal_step = [](float got, double exact) { return std::abs(got - exact) <= 0x1p-149; };
  // x from -104 to 0, then 0 to 89.
  CHECK(max_ulp_error(0x80000000u, float_bits(-104.0f), fast_exp, subnormal_step) < 0.94);
  CHECK(max_ulp_error(0x00000000u, float_bits(89.0f), fast_exp, subnormal_step) < 0.94);
  CHECK(fast_exp(-kInf) == 0.0f);
  CHECK(fast_exp(-200.0f) == 0.0f);
  CHECK(fast_exp(100.0f) == kInf);
  CHECK(fast_exp(kInf) == kInf);
  CHECK(std::isnan(fast_exp(std::numeric_limits<float>::quiet_NaN())));
  CHECK(fast_exp(0.0f) == 1.0f);
}

TEST_CASE("fast_exp_nonpositive is within 0.94 ulp down to 2^-126 and 0 below", "[vec_math]") {
  // Below 2^-126: rounded once into a subnormal at the edge, 0 further down.
  auto flushed_or_near = [](float got, double exact) { return got == 0.0f || std::abs(got - exact) <= 0x1p-149; };
  CHECK(max_ulp_error(0x80000000u, float_bits(-104.0f), fast_exp_nonpositive, flushed_or_near) < 0.94);
  // Every float from the flush boundary up to ln(2^-126) and a little beyond, one by one.
  const float boundary = -87.33654475f;
  for (float x = boundary; x < -87.33f; x = std::nextafter(x, 0.0f)) {
    INFO("x = " << x);
    const double exact = std::exp(static_cast<double>(x));
    CHECK(std::abs(fast_exp_nonpositive(x) - exact) <= std::max(0x1p-149, exact * 1.2e-7));
  }
  CHECK(fast_exp_nonpositive(std::nextafter(boundary, -100.0f)) == 0.0f);
  // Every NaN payload stays NaN (a sum over a row with one must be NaN).
  for (uint32_t payload : {0x1u, 0x1ffu, 0x3fffffu}) {
    CHECK(std::isnan(fast_exp_nonpositive(bits_float(0x7fc00000u | payload))));
    CHECK(std::isnan(fast_exp_nonpositive(bits_float(0xffc00000u | payload))));
    CHECK(std::isnan(fast_exp(bits_float(0x7fc00000u | payload))));
  }
  CHECK(fast_exp_nonpositive(-kInf) == 0.0f);
  CHECK(fast_exp_nonpositive(-87.4f) == 0.0f);
  CHECK(fast_exp_nonpositive(-87.3f) > 0.0f);
  CHECK(std::isnan(fast_exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
  CHECK(fast_exp_nonpositive(0.0f) == 1.0f);
  CHECK(fast_exp_nonpositive(-0.0f) == 1.0f);
}

}  // namespace
}  // namespace dtr::cpu
