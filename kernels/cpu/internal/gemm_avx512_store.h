// The AVX-512 GEMM microkernels' epilogue (gemm_kernels.h's TileEpilogue) on up to 16 lanes of
// one C row: C = alpha * acc + beta * C, + bias; masked, so a tile's ragged right edge needs
// no scalar tail. Internal linkage: included only by files built with AVX-512 flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/internal/gemm_kernels.h"

namespace dtr::cpu::internal {
namespace {

// The lanes [0, n) of a 16-lane vector, n clamped to [0, 16].
inline __mmask16 lane_mask(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : n <= 0 ? __mmask16{0} : static_cast<__mmask16>((1u << n) - 1);
}

// Applies e to acc and writes the lanes in mask to c (bias: the same columns' bias values);
// Full: all 16 lanes, with plain loads and stores.
template <bool Full>
inline void store_lanes(float* c, __m512 acc, __mmask16 mask, const TileEpilogue& e, const float* bias) {
  auto load = [&](const float* x) { return Full ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(mask, x); };
  __m512 v = _mm512_mul_ps(acc, _mm512_set1_ps(e.alpha));
  if (e.beta != 0.0f) v = _mm512_fmadd_ps(_mm512_set1_ps(e.beta), load(c), v);
  if (bias != nullptr) v = _mm512_add_ps(v, load(bias));
  if (Full) {
    _mm512_storeu_ps(c, v);
  } else {
    _mm512_mask_storeu_ps(c, mask, v);
  }
}

// Asks for the lines of a C tile (rows x 32 floats, rows ldc apart) for writing, at the
// start of a tile: its epilogue then finds them in cache instead of waiting for each miss
// (a large C is revisited per K block, and written lines are read for ownership anyway).
inline void prefetch_c_tile(const float* c, int64_t rows, int64_t ldc) {
  for (int64_t i = 0; i < rows; ++i) {
    __builtin_prefetch(c + i * ldc, 1);
    __builtin_prefetch(c + i * ldc + 31, 1);
  }
}

// Stores rows of 32 accumulators (two vectors each) for a tile m x n: the layout of every
// AVX-512 microkernel here (nr = 32). Always inlined: called, it takes the accumulators as
// arrays in memory, so the microkernel would zero and spill 28 vectors on the stack per tile
// (about 3% of a bfloat16 product on Zen 4, where GCC declined to inline it).
template <int M>
[[gnu::always_inline]] inline void store_tile32(const __m512 (&lo)[M], const __m512 (&hi)[M], float* c, int64_t ldc,
                                                int64_t n, const TileEpilogue& e) {
  const float* bias_hi = e.bias != nullptr ? e.bias + 16 : nullptr;
  // Unrolled like the K loops, so the accumulators stay registers (no copies kept in memory).
  if (n >= 32) {
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) {
      store_lanes<true>(c + i * ldc, lo[i], 0, e, e.bias);
      store_lanes<true>(c + i * ldc + 16, hi[i], 0, e, bias_hi);
    }
    return;
  }
  const __mmask16 m0 = lane_mask(n), m1 = lane_mask(n - 16);
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
    store_lanes<false>(c + i * ldc, lo[i], m0, e, e.bias);
    if (m1 != 0) store_lanes<false>(c + i * ldc + 16, hi[i], m1, e, bias_hi);
  }
}

}  // namespace
}  // namespace dtr::cpu::internal
