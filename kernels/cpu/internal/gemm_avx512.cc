// AVX-512 float32 GEMM microkernel (gemm_kernels.h): a 14 x 32 register tile, 28 zmm
// accumulators, each k step two 16-float loads of the B panel and 14 broadcasts of A
// (embedded in the FMAs), so the two FMA ports stay busy. Tiles of fewer rows run a kernel
// compiled for that row count (no wasted rows); fewer columns, masked lanes. bfloat16
// inputs are widened while packing and multiplied here as float32.
#include <immintrin.h>

#include "kernels/cpu/internal/gemm_avx512_store.h"
#include "kernels/cpu/internal/gemm_kernels.h"
#include "kernels/cpu/internal/gemm_pack.h"

namespace dtr::cpu::internal {
namespace {

constexpr int kMr = 14;
constexpr int kNr = 32;

// C rows [0, M) of the tile: for each k, acc[i] += a[i] * b[0..32).
// A's value (i, p) is a[i * AStride + p * AStep]: (1, kMr) in the k-major panels, (kc, 1) in
// the "rows" format (gemm_kernels.h); compile-time strides keep the broadcasts' addresses immediates.
template <int M, int AStride, int AStep>
void tile_rows(int64_t kp, const float* a, const float* b, float* c, int64_t ldc, int64_t n, const TileEpilogue& e) {
  prefetch_c_tile(c, M, ldc);
  __m512 lo[M], hi[M];
#pragma GCC unroll 14
  for (int i = 0; i < M; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p, a += AStep, b += kNr) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 14
    for (int i = 0; i < M; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i * AStride]);
      lo[i] = _mm512_fmadd_ps(ai, b0, lo[i]);
      hi[i] = _mm512_fmadd_ps(ai, b1, hi[i]);
    }
  }
  store_tile32<M>(lo, hi, c, ldc, n, e);
}

template <int AStride, int AStep>
void tile(int64_t kp, const void* a, const void* b, float* c, int64_t ldc, int64_t m, int64_t n,
          const TileEpilogue& e) {
  with_rows<kMr>(m, [&]<int M>() {
    tile_rows<M, AStride, AStep>(kp, static_cast<const float*>(a), static_cast<const float*>(b), c, ldc, n, e);
  });
}

}  // namespace

// A block of 14 x 18 = 252 rows x 256 K (252 KiB) and a B block of 256 x 1024 (1 MiB) sit in
// a 2 MiB L2; one A panel (14 KiB) stays in L1 while the B panels stream past it. bfloat16's
// K block is twice as long (512), so its B block is half as wide.
const GemmKernels kGemmAvx512F32 =
    widening_kernels<kMr, kNr, kKcF32, float>(kMr * 18, 1024, tile<1, kMr>, tile<kKcF32, 1>);
const GemmKernels kGemmAvx512Bf16 =
    widening_kernels<kMr, kNr, kKcBf16, uint16_t>(kMr * 18, 512, tile<1, kMr>, tile<kKcBf16, 1>);

}  // namespace dtr::cpu::internal
