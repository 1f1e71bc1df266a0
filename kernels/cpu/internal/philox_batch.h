// philox_batch: Philox4x32-10 for kPhiloxBatch consecutive blocks at once, the generator
// under the CPU random kernels.
//
// Word for word the same as philox_block (kernels/philox.h) of each block: the batch only
// changes how the rounds are computed. A round's two 32x32->64-bit products have no
// portable vector form that GCC finds (it emulates 64x64 products and repacks lanes at
// every round, slower than scalar code), so on AVX2 they are _mm256_mul_epu32 on the even
// and odd lanes, recombined with blends (Random123's and cuRAND's host generators do the
// same); other hosts compute the blocks one at a time. Words are stored word-major:
// words.w[k][j] is word k of block first + j.
#pragma once

#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/philox.h"

namespace dtr::cpu {

inline constexpr int kPhiloxBatch = 16;

struct PhiloxWords {
  alignas(64) uint32_t w[4][kPhiloxBatch];
};

#if defined(__AVX2__)
namespace philox_internal {

// hi and lo halves of a * m for eight 32-bit lanes (m the same in every lane).
[[gnu::always_inline]] inline void mul_hi_lo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);                        // products of lanes 0, 2, 4, 6
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // products of lanes 1, 3, 5, 7
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

}  // namespace philox_internal
#endif

// The four words of blocks first, first + 1, ..., first + kPhiloxBatch - 1 under seed.
[[gnu::always_inline]] inline void philox_batch(uint64_t seed, uint64_t first, PhiloxWords& words) {
#if defined(__AVX2__)
  using philox_internal::mul_hi_lo;
  constexpr int kVectors = kPhiloxBatch / 8;
  for (int j = 0; j < kPhiloxBatch; ++j) {
    words.w[0][j] = static_cast<uint32_t>(first + j);
    words.w[1][j] = static_cast<uint32_t>((first + j) >> 32);
  }
  __m256i c0[kVectors], c1[kVectors], c2[kVectors], c3[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    c0[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(&words.w[0][8 * v]));
    c1[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(&words.w[1][8 * v]));
    c2[v] = _mm256_setzero_si256();
    c3[v] = _mm256_setzero_si256();
  }
  const __m256i mul0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i mul1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma GCC unroll 10
  for (int round = 0; round < 10; ++round) {
    const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0)), key1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (int v = 0; v < kVectors; ++v) {
      __m256i hi0, lo0, hi1, lo1;
      mul_hi_lo(c0[v], mul0, hi0, lo0);
      mul_hi_lo(c2[v], mul1, hi1, lo1);
      c0[v] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[v]), key0);
      c2[v] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[v]), key1);
      c1[v] = lo1;
      c3[v] = lo0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int v = 0; v < kVectors; ++v) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(&words.w[0][8 * v]), c0[v]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(&words.w[1][8 * v]), c1[v]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(&words.w[2][8 * v]), c2[v]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(&words.w[3][8 * v]), c3[v]);
  }
#else
  for (int j = 0; j < kPhiloxBatch; ++j) {
    const Uint32x4 block = philox_block(seed, first + j);
    for (int k = 0; k < 4; ++k) words.w[k][j] = block.v[k];
  }
#endif
}

}  // namespace dtr::cpu
