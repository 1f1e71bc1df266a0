// convert_block: a contiguous run of elements converted from one element type to another,
// as convert<To>(from) does element by element, but in loops that vectorise.
//
// The results are bit for bit those of convert: for float16 <-> float with F16C this is the
// same hardware conversion as Half's, 8 elements per instruction; every other pair is the
// scalar convert in a plain loop (bfloat16's conversions are integer bit operations that
// the compiler vectorises). Kernels over 16-bit floats convert blocks of their operands to
// float with it, compute on floats, and convert the block back (ATen's Vectorized<Half>).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace dtr::cpu {

template <class To, class From>
[[gnu::always_inline]] inline void convert_block(const From* in, To* out, int64_t n) {
  int64_t i = 0;
#if DTR_HAS_F16C
  if constexpr (std::is_same_v<From, Half> && std::is_same_v<To, float>) {
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    }
  } else if constexpr (std::is_same_v<From, float> && std::is_same_v<To, Half>) {
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    }
  }
#endif
  // 16-bit floats are moved as their bits: GCC vectorises no load or store of a struct.
  constexpr bool kFrom16 = std::is_same_v<From, BFloat16> || std::is_same_v<From, Half>;
  constexpr bool kTo16 = std::is_same_v<To, BFloat16> || std::is_same_v<To, Half>;
  auto load = [in](int64_t k) {
    if constexpr (kFrom16) {
      From v;
      v.bits = reinterpret_cast<const uint16_t*>(in)[k];
      return v;
    } else {
      return in[k];
    }
  };
  for (; i < n; ++i) {
    if constexpr (kTo16) {
      reinterpret_cast<uint16_t*>(out)[i] = convert<To>(load(i)).bits;
    } else {
      out[i] = convert<To>(load(i));
    }
  }
}

}  // namespace dtr::cpu
