// AMX bfloat16 GEMM microkernel (gemm_kernels.h): a 32 x 32 float32 tile held in four AMX
// accumulator tiles (tmm0-3, 16 x 16 each), fed per 32 K values by two A tiles (tmm4-5:
// 16 rows x 32 bfloat16) and two B tiles (tmm6-7: 16 K pairs x 16 columns x 2, the "VNNI"
// layout TDPBF16PS wants), four TDPBF16PS per step. Panels: A in 32-value rows per 32-K
// chunk (pack_panels' G = 32, so a tile load is one 64-byte row per C row); B per 32-K chunk
// as two 1 KiB tiles of pairs. The accumulators go to C directly when there is nothing to
// apply, else through a 4 KiB buffer to the AVX-512 epilogue. The OS permission for tile data is cpu_isa.cc's (once per
// process); the tile configuration is loaded once per thread. (Intel's AMX guide; oneDNN's brgemm.)
#include <immintrin.h>

#include "kernels/cpu/internal/gemm_avx512_store.h"
#include "kernels/cpu/internal/gemm_kernels.h"
#include "kernels/cpu/internal/gemm_pack.h"

namespace dtr::cpu::internal {
namespace {

constexpr int kMr = 32;
constexpr int kNr = 32;
constexpr int kChunk = 32;      // K values per TDPBF16PS
constexpr int kTileBytes = 64;  // bytes per tile row

// LDTILECFG's 64-byte operand, palette 1: tiles 0-7 all 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {kTileBytes, kTileBytes, kTileBytes, kTileBytes, kTileBytes, kTileBytes, kTileBytes, kTileBytes};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

void configure_tiles() {
  thread_local bool configured = false;
  if (configured) return;
  static const TileConfig config;
  _tile_loadconfig(&config);
  configured = true;
}

// Word permutations of the A packer: the even and the odd words of two vectors (the first's
// 0..31, then the second's 32..63). (The B packer's interleave is gemm_pack.h's.)
alignas(64) constexpr int16_t kEvenWords[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                                32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
alignas(64) constexpr int16_t kOddWords[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                               33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

// Full 16 x 32 blocks of B's pairs (one tile: 16 K pairs x 16 columns x 2) built with vector
// instructions; the packers fall back to pack_panels for the ragged ones. src(j, kk) is
// B^T's view (rows are B's columns), as pack_b gets it.
void pack_b_tile_full(uint16_t* d, const uint16_t* src, int64_t rs, int64_t cs) {
  if (cs == 1) {
    // B^T rows hold K contiguous (a transposed B, the forward's weight): a pair is one
    // 32-bit word, so tile row t gathers word t of 16 rows.
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(static_cast<int32_t>(rs)));
    for (int t = 0; t < 16; ++t) {
      _mm512_storeu_si512(d + t * 32, _mm512_i32gather_epi32(rows, src + 2 * t, 2));
    }
    return;
  }
  // A row-major B: tile row t interleaves B's rows 2t and 2t+1 (16 columns each).
  const __m512i interleave = _mm512_load_si512(kInterleaveWords);
  for (int t = 0; t < 16; ++t) {
    const __m256i even = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * t * cs));
    const __m256i odd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (2 * t + 1) * cs));
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(even), odd, 1);
    _mm512_storeu_si512(d + t * 32, _mm512_permutexvar_epi16(interleave, both));
  }
}

// B panels: per 32-K chunk, the 32 columns as two tiles of 16, each 16 K pairs x 16 columns x 2.
void pack_b(void* dst, const void* src, int64_t rs, int64_t cs, int64_t rows, int64_t k, int64_t kp) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  // Chunk by chunk, then across the columns: the source's K rows (or lines) are read in
  // order, as the hardware prefetchers follow them.
  for (int64_t k0 = 0; k0 < kp; k0 += kChunk) {
    for (int64_t r0 = 0; r0 < rows; r0 += kNr) {
      uint16_t* chunk = d + r0 * kp + k0 * kNr;  // panel r0 / kNr, chunk k0 / kChunk
      for (int64_t half = 0; half < kNr; half += 16) {
        const int64_t live_rows = rows - r0 - half, live_k = k - k0;
        const uint16_t* block = s + (r0 + half) * rs + k0 * cs;
        uint16_t* tile = chunk + half * kChunk;
        if (live_rows >= 16 && live_k >= kChunk) {
          pack_b_tile_full(tile, block, rs, cs);
        } else {
          pack_panels<16, 2>(tile, block, rs, cs, live_rows < 16 ? live_rows : 16,
                             live_k < kChunk ? (live_k > 0 ? live_k : 0) : kChunk, kChunk, 1);
        }
      }
    }
  }
}

// A panels: 32 rows x 32 K per chunk, row-major (a tile row is one C row's 32 K values). A
// row-major A copies; a transposed one (rows contiguous) transposes 32 x 32 blocks: each
// 32-bit gather takes rows i and i+1 of one K value, 16 K values at a time, and a word
// permutation splits the pairs into the two tile rows.
void pack_a(void* dst, const void* src, int64_t rs, int64_t cs, int64_t rows, int64_t k, int64_t kp) {
  if (cs == 1) {
    pack_block<kMr, kChunk, uint16_t, uint16_t>(dst, src, rs, cs, rows, k, kp);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  const __m512i ks = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32(static_cast<int32_t>(cs)));
  const __m512i even_words = _mm512_load_si512(kEvenWords), odd_words = _mm512_load_si512(kOddWords);
  // Chunk by chunk, then across the rows, so the source's K rows are read in order.
  for (int64_t k0 = 0; k0 < kp; k0 += kChunk) {
    for (int64_t r0 = 0; r0 < rows; r0 += kMr) {
      uint16_t* chunk = d + r0 * kp + k0 * kMr;  // panel r0 / kMr, chunk k0 / kChunk
      const int64_t live_rows = rows - r0, live_k = k - k0;
      const uint16_t* block = s + r0 + k0 * cs;
      if (live_rows < kMr || live_k < kChunk) {
        pack_panels<kMr, kChunk>(chunk, block, rs, cs, live_rows < kMr ? live_rows : kMr,
                                 live_k < kChunk ? (live_k > 0 ? live_k : 0) : kChunk, kChunk, 1);
        continue;
      }
      for (int i = 0; i < kMr; i += 2) {
        const __m512i lo = _mm512_i32gather_epi32(ks, block + i, 2);            // K 0..15, rows i, i+1
        const __m512i hi = _mm512_i32gather_epi32(ks, block + 16 * cs + i, 2);  // K 16..31
        _mm512_storeu_si512(chunk + i * kChunk, _mm512_permutex2var_epi16(lo, even_words, hi));
        _mm512_storeu_si512(chunk + (i + 1) * kChunk, _mm512_permutex2var_epi16(lo, odd_words, hi));
      }
    }
  }
}

void tile(int64_t kp, const void* a_panel, const void* b_panel, float* c, int64_t ldc, int64_t m, int64_t n,
          const TileEpilogue& e) {
  configure_tiles();
  const uint16_t* a = static_cast<const uint16_t*>(a_panel);
  const uint16_t* b = static_cast<const uint16_t*>(b_panel);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k0 = 0; k0 < kp; k0 += kChunk, a += kMr * kChunk, b += kNr * kChunk) {
    _tile_loadd(4, a, kTileBytes);
    _tile_loadd(5, a + 16 * kChunk, kTileBytes);
    _tile_loadd(6, b, kTileBytes);
    _tile_loadd(7, b + 16 * kChunk, kTileBytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  if (m == kMr && n == kNr && e.alpha == 1.0f && e.beta == 0.0f && e.bias == nullptr) {
    // A full tile with nothing to apply: straight from the tiles to C (the same values).
    _tile_stored(0, c, ldc * 4);
    _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
    return;
  }
  alignas(64) float acc[kMr][kNr];
  _tile_stored(0, &acc[0][0], kNr * 4);
  _tile_stored(1, &acc[0][16], kNr * 4);
  _tile_stored(2, &acc[16][0], kNr * 4);
  _tile_stored(3, &acc[16][16], kNr * 4);
  const __mmask16 m0 = lane_mask(n), m1 = lane_mask(n - 16);
  const float* bias_hi = e.bias != nullptr ? e.bias + 16 : nullptr;
  for (int64_t i = 0; i < m; ++i) {
    store_lanes<false>(c + i * ldc, _mm512_load_ps(&acc[i][0]), m0, e, e.bias);
    if (m1 != 0) store_lanes<false>(c + i * ldc + 16, _mm512_load_ps(&acc[i][16]), m1, e, bias_hi);
  }
}

}  // namespace

// An A block of 256 x 512 (256 KiB) and a B block of 512 x 1024 (1 MiB) in L2.
const GemmKernels kGemmAmxBf16 = {.mr = kMr,
                                  .nr = kNr,
                                  .mc = kMr * 8,
                                  .nc = 1024,
                                  .k_align = kChunk,
                                  .packed_bytes = 2,
                                  .pack_a = pack_a,
                                  .pack_b = pack_b,
                                  .tile = tile};

}  // namespace dtr::cpu::internal
