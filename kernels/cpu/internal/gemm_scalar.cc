// Portable float32 GEMM microkernel (gemm_kernels.h): a 4 x 8 tile of plain C++ that any
// x86-64 runs (built with -mno-avx: SSE2 at most), the path below AVX2 and the one
// DTR_CPU_ISA=scalar forces. Products and sums are separate roundings here (no FMA), so its
// bits differ from the vector paths'; its summation order is the same (gemm.h).
#include "kernels/cpu/internal/gemm_kernels.h"
#include "kernels/cpu/internal/gemm_pack.h"

namespace dtr::cpu::internal {
namespace {

constexpr int kMr = 4;
constexpr int kNr = 8;

void tile(int64_t kp, const void* a_panel, const void* b_panel, float* c, int64_t ldc, int64_t m, int64_t n,
          const TileEpilogue& e) {
  const float* a = static_cast<const float*>(a_panel);
  const float* b = static_cast<const float*>(b_panel);
  float acc[kMr][kNr] = {};
  for (int64_t p = 0; p < kp; ++p, a += kMr, b += kNr) {
    for (int i = 0; i < kMr; ++i) {
      for (int j = 0; j < kNr; ++j) acc[i][j] += a[i] * b[j];
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float v = e.alpha * acc[i][j];
      if (e.beta != 0.0f) v += e.beta * c[i * ldc + j];
      if (e.bias != nullptr) v += e.bias[j];
      c[i * ldc + j] = v;
    }
  }
}

}  // namespace

const GemmKernels kGemmScalarF32 = widening_kernels<kMr, kNr, kKcF32, float>(kMr * 32, 256, tile, nullptr);
const GemmKernels kGemmScalarBf16 = widening_kernels<kMr, kNr, kKcBf16, uint16_t>(kMr * 32, 128, tile, nullptr);

}  // namespace dtr::cpu::internal
