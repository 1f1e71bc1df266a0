// The per-ISA pieces of the CPU GEMM (kernels/cpu/gemm.h): how to pack A and B into panels
// and the register-tile microkernel that multiplies one A panel by one B panel, with the
// block sizes that suit them. Each ISA's file is compiled with its own target flags and
// exports its tables; the driver (gemm.cc) picks one at run time and owns the loops.
//
// Packed layout, shared by every table: a block of `rows` rows (A's rows, or B's columns)
// and kp = round_up(k, k_align) values of K (k <= the K block kc, gemm.h's kGemmKc or
// kGemmKcBf16) becomes ceil(rows / r) panels (r = mr for A, nr for B), zero-padded in both
// directions, of r * kp packed elements; how a panel orders them is the table's own business
// (its pack and tile functions agree). A table may also take a row-major A in a second
// format, "rows": each panel row a plain copy of A's row and zeros up to kp, rows kc apart
// (panels of mr * kc elements, rows past the block and values past kp unwritten and unread),
// so that packing the common forward operand is a copy rather than a transpose.
#pragma once

#include <cstdint>

namespace dtr::cpu::internal {

// What a microkernel does with its accumulator tile acc: C = alpha * acc + beta * C (C not
// read when beta == 0), then + bias[j] when bias is set (bias points at the tile's first column).
struct TileEpilogue {
  float alpha;
  float beta;
  const float* bias;
};

// The K blocks (gemm.h's kGemmKc and kGemmKcBf16): the "rows" format's row stride.
inline constexpr int kKcF32 = 256;
inline constexpr int kKcBf16 = 512;

struct GemmKernels {
  int64_t mr, nr;        // the register tile
  int64_t mc, nc;        // rows of a packed A block, columns of a packed B block (multiples of mr, nr)
  int64_t k_align;       // packed K is a multiple of this
  int64_t packed_bytes;  // bytes of one packed element
  // Packs `rows` rows (element (i, kk) at src[i * rs + kk * cs]) of k values into panels of
  // r rows (A: mr, B seen as B^T: nr) with kp values each; src is float or uint16_t (bfloat16 bits).
  using Pack = void (*)(void* dst, const void* src, int64_t rs, int64_t cs, int64_t rows, int64_t k, int64_t kp);
  // The tile C [m <= mr, n <= nr] (rows ldc apart) from one A and one B panel of kp values.
  using Tile = void (*)(int64_t kp, const void* a_panel, const void* b_panel, float* c, int64_t ldc, int64_t m,
                        int64_t n, const TileEpilogue& epilogue);
  Pack pack_a, pack_b;
  Tile tile;
  // The "rows" format of A (cs == 1 sources), or nullptr where the table has none; used for N
  // blocks of at most rows_max_n columns (0: any).
  Pack pack_a_rows = nullptr;
  Tile tile_a_rows = nullptr;
  int64_t rows_max_n = 0;
};

// Per ISA: float32 inputs, and bfloat16 inputs (uint16_t bits) with float32 accumulation.
// Below avx512_bf16 bfloat16 is converted to float32 while packing and multiplied as float32.
extern const GemmKernels kGemmScalarF32, kGemmScalarBf16;  // gemm_scalar.cc
extern const GemmKernels kGemmAvx2F32, kGemmAvx2Bf16;      // gemm_avx2.cc
extern const GemmKernels kGemmAvx512F32, kGemmAvx512Bf16;  // gemm_avx512.cc
extern const GemmKernels kGemmAvx512DotBf16;               // gemm_avx512_bf16.cc (vdpbf16ps)
extern const GemmKernels kGemmAmxBf16;                     // gemm_amx.cc (TDPBF16PS)

}  // namespace dtr::cpu::internal
