// AVX512-BF16 GEMM microkernel (gemm_kernels.h): bfloat16 inputs, float32 accumulators, a
// 14 x 32 tile like the float32 AVX-512 kernel's, but each step takes a pair of K values:
// vdpbf16ps adds a[2t] b[2t] + a[2t+1] b[2t+1] into each lane. Panels hold K in pairs
// (pack_panels' G = 2; an odd K gets a zero partner), so one 32-bit broadcast carries A's
// pair and one 64-byte load 16 columns' pairs of B. For N blocks of up to 256 columns a
// row-major A packs in the "rows" format instead (a copy, its pairs already adjacent):
// there, interleaving 14 rows' pairs took about a sixth of the product's time. Wider blocks
// multiply each packed panel by more of B, and the pair panels' broadcasts (one line per step
// rather than 14) win (Zen 4: docs/cpu_gemm.md).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/internal/gemm_avx512_store.h"
#include "kernels/cpu/internal/gemm_kernels.h"
#include "kernels/cpu/internal/gemm_pack.h"

namespace dtr::cpu::internal {
namespace {

constexpr int kMr = 14;
constexpr int kNr = 32;

// kp (even) K values: kp / 2 steps of pairs. A's pair (i, t) starts at a[i * AStride + t * AStep]:
// (2, 2 kMr) in the pair panels, (kc, 2) in the "rows" format.
template <int M, int AStride, int AStep>
void tile_rows(int64_t kp, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, int64_t n,
               const TileEpilogue& e) {
  prefetch_c_tile(c, M, ldc);
  __m512 lo[M], hi[M];
#pragma GCC unroll 14
  for (int i = 0; i < M; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < kp / 2; ++t, a += AStep, b += 2 * kNr) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 32);
#pragma GCC unroll 14
    for (int i = 0; i < M; ++i) {
      int32_t pair;
      std::memcpy(&pair, a + i * AStride, sizeof pair);
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(pair);
      lo[i] = _mm512_dpbf16_ps(lo[i], ai, b0);
      hi[i] = _mm512_dpbf16_ps(hi[i], ai, b1);
    }
  }
  store_tile32<M>(lo, hi, c, ldc, n, e);
}

// A's pair panels, 14 rows' pairs of one K pair per 56-byte store (the generic packer wrote
// them value by value: about an eighth of a weight gradient's product). From a row-major A
// (wide N blocks; narrow ones take the rows format) a pair is a 32-bit word of its row: one
// gather of 14 words. From a transposed A (rows contiguous: the weight gradient's dy^T) the
// pairs are two K lines interleaved: 14 words of each in one vector and one word
// permutation. Ragged panels and an odd K go to the generic packer.
void pack_a(void* dst, const void* src, int64_t rs, int64_t cs, int64_t rows, int64_t k, int64_t kp) {
  if (k != kp) {
    pack_block<kMr, 2, uint16_t, uint16_t>(dst, src, rs, cs, rows, k, kp);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  const int64_t full = rows / kMr;
  constexpr __mmask16 kPanelRows = (1u << kMr) - 1;  // a panel's rows as 32-bit or 16-bit lanes
  if (cs == 1) {
    const __m512i row_offsets =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 0, 0),
                           _mm512_set1_epi32(static_cast<int32_t>(rs * 2)));
    for (int64_t p = 0; p < full; ++p) {
      const uint16_t* panel = s + p * kMr * rs;
      for (int64_t kk = 0; kk < k; kk += 2) {
        const __m512i pairs =
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), kPanelRows, row_offsets, panel + kk, 1);
        _mm512_mask_storeu_epi32(d + p * kMr * kp + kk * kMr, kPanelRows, pairs);
      }
    }
  } else {  // rs == 1
    const __m512i interleave = _mm512_load_si512(kInterleaveWords);
    constexpr __mmask32 kPanelWords = (1u << (2 * kMr)) - 1;
    for (int64_t kk = 0; kk < k; kk += 2) {  // K lines in order, each read once across the panels
      const uint16_t* even = s + kk * cs;
      const uint16_t* odd = even + cs;
      for (int64_t p = 0; p < full; ++p) {
        const __m256i lo = _mm256_maskz_loadu_epi16(kPanelRows, even + p * kMr);
        const __m256i hi = _mm256_maskz_loadu_epi16(kPanelRows, odd + p * kMr);
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        _mm512_mask_storeu_epi16(d + p * kMr * kp + kk * kMr, kPanelWords, _mm512_permutexvar_epi16(interleave, both));
      }
    }
  }
  if (full * kMr < rows) {
    pack_panels<kMr, 2>(d + full * kMr * kp, s + full * kMr * rs, rs, cs, rows - full * kMr, k, kp, 1);
  }
}

template <int AStride, int AStep>
void tile(int64_t kp, const void* a, const void* b, float* c, int64_t ldc, int64_t m, int64_t n,
          const TileEpilogue& e) {
  with_rows<kMr>(m, [&]<int M>() {
    tile_rows<M, AStride, AStep>(kp, static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), c, ldc, n, e);
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
                                        .pack_a = pack_a,
                                        .pack_b = pack_block<kNr, 2, uint16_t, uint16_t>,
                                        .tile = tile<2, 2 * kMr>,
                                        .pack_a_rows = pack_rows<kMr, kKcBf16, uint16_t, uint16_t>,
                                        .tile_a_rows = tile<kKcBf16, 2>,
                                        .rows_max_n = 256};

}  // namespace dtr::cpu::internal
