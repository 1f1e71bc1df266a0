// Branch-free scalar math for CPU kernels, written so that loops calling it vectorise.
//
// is_nan(v) is v != v (false for integers). exp_of(x) is fast_exp for float and std::exp
// for double; exp_nonpositive_of(x), for arguments <= 0, is the cheaper
// fast_exp_nonpositive for float. fast_exp is exp for float without glibc's call per
// element, within 0.94 ulp of exp for normal results (the classic Cephes/SLEEF scheme).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace dtr::cpu {

template <class M>
bool is_nan(M v) {
  return v != v;  // true only for NaN
}

// exp(x) = 2^n p, for x in [-104, 89] or NaN: n = round(x / ln 2) and p = exp(r) for
// r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split in a short high part, so n * hi is exact,
// and a low part), p being exp's Taylor polynomial to degree 7 (truncation below 0.1 ulp).
// The callers scale by 2^n, built from exponent bits.
struct ExpParts {
  float p;
  int32_t n;
};
[[gnu::always_inline]] inline ExpParts exp_parts(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;       // 15 significant bits
  constexpr float kLn2Lo = 1.42860682030941723e-6f;  // ln 2 - kLn2Hi
  constexpr float kRound = 12582912.0f;              // 1.5 * 2^23: adding it rounds to an integer
  const float shifted = x * kLog2e + kRound;
  const float n = shifted - kRound;
  const int32_t ni = static_cast<int32_t>(float_bits(shifted) - float_bits(kRound));  // n as an integer
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return {p, ni};
}

// exp(x) for float, 2^n as two factors. Against exp in double (tests/kernels/vec_math_test,
// every 61st float bit pattern, and the boundary values): within 0.94 ulp for normal
// results, within one subnormal step below them, exactly 0 and inf beyond, NaN stays NaN.
[[gnu::always_inline]] inline float fast_exp(float x) {
  // Beyond [-104, 89] exp is 0 or inf in float; clamping keeps 2^n's factors normal (NaN passes).
  const auto [p, n] = exp_parts(std::clamp(x, -104.0f, 89.0f));
  const int32_t half = n >> 1;  // 2^n = 2^half * 2^(n - half), both normal for n in [-151, 129]
  const float scale_a = bits_float(static_cast<uint32_t>(half + 127) << 23);
  const float scale_b = bits_float(static_cast<uint32_t>(n - half + 127) << 23);
  return p * scale_a * scale_b;
}

// exp(x) for x <= 0 (or NaN), the argument of every exp in softmax, log_softmax and
// cross_entropy (x - max, x - logsumexp) and in sigmoid written as exp(-|x|). Cheaper than
// fast_exp, which also handles overflow and results far below the normal range: the same
// reduction and polynomial, scaled by one factor 2^n (n in [-126, 0], a normal float; the
// product rounds once, into a subnormal just below 2^-126), and results for x below
// ln(2^-126) (-87.34) flushed to 0, -inf included. A NaN stays NaN (it is multiplied).
[[gnu::always_inline]] inline float fast_exp_nonpositive(float x) {
  constexpr float kMin = -87.33654475f;                // about ln(2^-126): below it the result is flushed
  const auto [p, n] = exp_parts(kMin > x ? kMin : x);  // n >= -126 (a NaN x stays)
  const float e = p * bits_float(static_cast<uint32_t>(n + 127) << 23);
  return x < kMin ? 0.0f : e;
}

// exp in a kernel's compute type: fast_exp for float, std::exp for double.
template <class M>
[[gnu::always_inline]] inline M exp_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return fast_exp(x);
  } else {
    return std::exp(x);
  }
}

// exp of x <= 0 in a kernel's compute type: fast_exp_nonpositive for float, std::exp for
// double.
template <class M>
[[gnu::always_inline]] inline M exp_nonpositive_of(M x) {
  if constexpr (std::is_same_v<M, float>) {
    return fast_exp_nonpositive(x);
  } else {
    return std::exp(x);
  }
}

}  // namespace dtr::cpu
