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

// B panels: per 32-K chunk, the 32 columns as two tiles of 16, each 16 K pairs x 16 columns x 2.
void pack_b(void* dst, const void* src, int64_t rs, int64_t cs, int64_t rows, int64_t k, int64_t kp) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t r0 = 0; r0 < rows; r0 += kNr) {
    for (int64_t k0 = 0; k0 < kp; k0 += kChunk) {
      for (int64_t half = 0; half < kNr; half += 16, d += 16 * kChunk) {
        const int64_t live_rows = rows - r0 - half, live_k = k - k0;
        pack_panels<16, 2>(d, s + (r0 + half) * rs + k0 * cs, rs, cs, live_rows < 16 ? live_rows : 16,
                           live_k < kChunk ? (live_k > 0 ? live_k : 0) : kChunk, kChunk, 1);
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
    store_lanes(c + i * ldc, _mm512_load_ps(&acc[i][0]), m0, e, e.bias);
    if (m1 != 0) store_lanes(c + i * ldc + 16, _mm512_load_ps(&acc[i][16]), m1, e, bias_hi);
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
                                  .pack_a = pack_block<kMr, kChunk, uint16_t, uint16_t>,
                                  .pack_b = pack_b,
                                  .tile = tile};

}  // namespace dtr::cpu::internal
