// AVX2 + FMA float32 GEMM microkernel (gemm_kernels.h): a 6 x 16 register tile, 12 ymm
// accumulators, each k step two 8-float loads of the B panel and 6 broadcasts of A. Tiles of
// fewer rows run a kernel compiled for that row count; fewer columns, masked loads and
// stores (vmaskmovps). bfloat16 inputs are widened while packing. Built with -mno-avx512f,
// so this path is what an AVX2-only CPU runs, on any build host.
#include <immintrin.h>

#include "kernels/cpu/internal/gemm_kernels.h"
#include "kernels/cpu/internal/gemm_pack.h"

namespace dtr::cpu::internal {
namespace {

constexpr int kMr = 6;
constexpr int kNr = 16;

// The lanes [0, n) of an 8-lane vector as vmaskmovps wants them (sign bits), n clamped.
__m256i lane_mask(int64_t n) {
  const int32_t lanes = n >= 8 ? 8 : n <= 0 ? 0 : static_cast<int32_t>(n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// TileEpilogue on the lanes in mask of one C row; Full: all 8 lanes, with plain loads and
// stores (vmaskmovps is microcoded on AMD's cores: a masked store costs several cycles).
template <bool Full>
void store_lanes(float* c, __m256 acc, __m256i mask, const TileEpilogue& e, const float* bias) {
  auto load = [&](const float* x) { return Full ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, mask); };
  __m256 v = _mm256_mul_ps(acc, _mm256_set1_ps(e.alpha));
  if (e.beta != 0.0f) v = _mm256_fmadd_ps(_mm256_set1_ps(e.beta), load(c), v);
  if (bias != nullptr) v = _mm256_add_ps(v, load(bias));
  if (Full) {
    _mm256_storeu_ps(c, v);
  } else {
    _mm256_maskstore_ps(c, mask, v);
  }
}

// A's value (i, p) is a[i * AStride + p * AStep]: (1, kMr) in the k-major panels, (kc, 1) in
// the "rows" format (gemm_kernels.h); compile-time strides keep the broadcasts' addresses immediates.
template <int M, int AStride, int AStep>
void tile_rows(int64_t kp, const float* a, const float* b, float* c, int64_t ldc, int64_t n, const TileEpilogue& e) {
  for (int i = 0; i < M; ++i) {  // C's lines, for the epilogue (as gemm_avx512_store.h's prefetch_c_tile)
    __builtin_prefetch(c + i * ldc, 1);
    __builtin_prefetch(c + i * ldc + 15, 1);
  }
  __m256 lo[M], hi[M];
#pragma GCC unroll 6
  for (int i = 0; i < M; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
  for (int64_t p = 0; p < kp; ++p, a += AStep, b += kNr) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < M; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i * AStride);
      lo[i] = _mm256_fmadd_ps(ai, b0, lo[i]);
      hi[i] = _mm256_fmadd_ps(ai, b1, hi[i]);
    }
  }
  const float* bias_hi = e.bias != nullptr ? e.bias + 8 : nullptr;
  // Unrolled like the K loop, so the accumulators stay registers (no copies kept in memory).
  if (n >= kNr) {
#pragma GCC unroll 6
    for (int i = 0; i < M; ++i) {
      store_lanes<true>(c + i * ldc, lo[i], __m256i{}, e, e.bias);
      store_lanes<true>(c + i * ldc + 8, hi[i], __m256i{}, e, bias_hi);
    }
    return;
  }
  const __m256i m0 = lane_mask(n), m1 = lane_mask(n - 8);
#pragma GCC unroll 6
  for (int i = 0; i < M; ++i) {
    store_lanes<false>(c + i * ldc, lo[i], m0, e, e.bias);
    if (n > 8) store_lanes<false>(c + i * ldc + 8, hi[i], m1, e, bias_hi);
  }
}

template <int AStride, int AStep>
void tile(int64_t kp, const void* a, const void* b, float* c, int64_t ldc, int64_t m, int64_t n,
          const TileEpilogue& e) {
  with_rows<kMr>(m, [&]<int M>() {
    tile_rows<M, AStride, AStep>(kp, static_cast<const float*>(a), static_cast<const float*>(b), c, ldc, n, e);
  });
}

}  // namespace

// Sized for a 32 KiB L1 and a 512 KiB L2 (Zen 3): an A panel of 6 x 256 (6 KiB), a B block
// of 256 x 384 (384 KiB).
const GemmKernels kGemmAvx2F32 =
    widening_kernels<kMr, kNr, kKcF32, float>(kMr * 24, 384, tile<1, kMr>, tile<kKcF32, 1>);
const GemmKernels kGemmAvx2Bf16 =
    widening_kernels<kMr, kNr, kKcBf16, uint16_t>(kMr * 24, 192, tile<1, kMr>, tile<kKcBf16, 1>);

}  // namespace dtr::cpu::internal
