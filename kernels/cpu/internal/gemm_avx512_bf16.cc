// AVX512-BF16 GEMM microkernel (gemm_kernels.h): bfloat16 inputs, float32 accumulators, a
// 14 x 32 tile like the float32 AVX-512 kernel's, but each step takes a pair of K values:
// vdpbf16ps adds a[2t] b[2t] + a[2t+1] b[2t+1] into each lane. Panels hold K in pairs
// (pack_panels' G = 2; an odd K gets a zero partner), so one 32-bit broadcast carries A's
// pair and one 64-byte load 16 columns' pairs of B.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/internal/gemm_avx512_store.h"
#include "kernels/cpu/internal/gemm_kernels.h"
#include "kernels/cpu/internal/gemm_pack.h"

namespace dtr::cpu::internal {
namespace {

constexpr int kMr = 14;
constexpr int kNr = 32;

// kp (even) K values: kp / 2 steps of pairs.
template <int M>
void tile_rows(int64_t kp, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, int64_t n,
               const TileEpilogue& e) {
  prefetch_c_tile(c, M, ldc);
  __m512 lo[M], hi[M];
#pragma GCC unroll 14
  for (int i = 0; i < M; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < kp / 2; ++t, a += 2 * kMr, b += 2 * kNr) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 32);
#pragma GCC unroll 14
    for (int i = 0; i < M; ++i) {
      int32_t pair;
      std::memcpy(&pair, a + 2 * i, sizeof pair);
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(pair);
      lo[i] = _mm512_dpbf16_ps(lo[i], ai, b0);
      hi[i] = _mm512_dpbf16_ps(hi[i], ai, b1);
    }
  }
  store_tile32<M>(lo, hi, c, ldc, n, e);
}

void tile(int64_t kp, const void* a, const void* b, float* c, int64_t ldc, int64_t m, int64_t n,
          const TileEpilogue& e) {
  with_rows<kMr>(m, [&]<int M>() {
    tile_rows<M>(kp, static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), c, ldc, n, e);
  });
}

}  // namespace

// Panels of bfloat16 pairs: an A panel of 14 x 512 is 14 KiB, a B block of 512 x 1024 1 MiB.
const GemmKernels kGemmAvx512DotBf16 = {.mr = kMr,
                                        .nr = kNr,
                                        .mc = kMr * 18,
                                        .nc = 1024,
                                        .k_align = 2,
                                        .packed_bytes = 2,
                                        .pack_a = pack_block<kMr, 2, uint16_t, uint16_t>,
                                        .pack_b = pack_block<kNr, 2, uint16_t, uint16_t>,
                                        .tile = tile};

}  // namespace dtr::cpu::internal
