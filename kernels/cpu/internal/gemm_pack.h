// Panel packing for the GEMM's per-ISA files (gemm_kernels.h). Included by each ISA's file,
// which compiles it with its own target flags: everything here has internal linkage, so that
// no copy built for one ISA is linked into another's path.
//
// pack_panels<R, G> writes panels of R rows; inside a panel, K runs in groups of G values
// kept together per row (G = 1: a column of R values per k, for broadcast microkernels;
// G = 2: bfloat16 pairs for vdpbf16ps; G = 32: an AMX tile row):
//   packed (i, kk) -> (kk / G) * R * G + i * G + kk % G.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/internal/gemm_kernels.h"

namespace dtr::cpu::internal {
namespace {

// How many source lines (rows of a row-major source, k-slices of a transposed one) ahead the
// packers prefetch: each is a short stream the hardware prefetchers would meet cold.
constexpr int64_t kPrefetchAhead = 4;

// The bfloat16 pair packers' word permutation (vpermw indices): words 0..15 and 16..31 of a
// vector, two 16-word rows, interleaved into 16 pairs.
alignas(64) constexpr int16_t kInterleaveWords[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// Prefetches the n elements at p (one touch per 64-byte line).
template <class T>
inline void prefetch_run(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < n * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(c + b);
}

// A packed value from a source one: float stays; bfloat16 bits widen to float32 or stay bits.
inline float pack_value(float v, float*) { return v; }
inline float pack_value(uint16_t v, float*) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint16_t pack_value(uint16_t v, uint16_t*) { return v; }

// `panels` panels of R rows x kp values from rows x k source values (src(i, kk) =
// src[i * rs + kk * cs]; rs == 1 or cs == 1), zeros beyond them. The source is read along its
// unit stride: a row at a time when K is contiguous; else a k at a time across every panel,
// so that each source line is read once (a transposed operand's lines are a leading dimension
// apart, which per-panel passes would fetch again from L2 or beyond).
template <int R, int G, class Out, class In>
void pack_panels(Out* dst, const In* src, int64_t rs, int64_t cs, int64_t rows, int64_t k, int64_t kp, int64_t panels) {
  auto live_rows = [&](int64_t p) {
    const int64_t live = rows - p * R;
    return live < R ? (live > 0 ? live : 0) : R;
  };
  for (int64_t p = 0; p < panels; ++p) {
    if (live_rows(p) < R || k < kp) std::memset(dst + p * R * kp, 0, sizeof(Out) * R * kp);
  }
  if (cs == 1) {  // K contiguous: a row at a time, G values per copy
    for (int64_t p = 0; p < panels; ++p) {
      for (int64_t i = 0; i < live_rows(p); ++i) {
        const In* row = src + (p * R + i) * rs;
        if (p * R + i + kPrefetchAhead < rows) prefetch_run(row + kPrefetchAhead * rs, k);
        for (int64_t g0 = 0; g0 < k; g0 += G) {
          Out* d = dst + p * R * kp + (g0 / G) * R * G + i * G;
          const int64_t run = k - g0 < G ? k - g0 : G;
          for (int64_t t = 0; t < run; ++t) d[t] = pack_value(row[g0 + t], d);
        }
      }
    }
    return;
  }
  for (int64_t kk = 0; kk < k; ++kk) {  // rows contiguous: a k at a time
    const In* sk = src + kk * cs;
    if (kk + kPrefetchAhead < k) prefetch_run(sk + kPrefetchAhead * cs, rows);
    for (int64_t p = 0; p < panels; ++p) {
      Out* d = dst + p * R * kp + (kk / G) * R * G + kk % G;
      const In* s = sk + p * R;
      const int64_t live = live_rows(p);
      for (int64_t i = 0; i < live; ++i) d[i * G] = pack_value(s[i], d);
    }
  }
}

// The "rows" format of A (gemm_kernels.h): panels of R rows, each row's k values copied
// (converted) to stride apart, then zeros up to kp (an odd K's last pair); the source has cs == 1.
template <int R, int Stride, class Out, class In>
void pack_rows(void* dst, const void* src, int64_t rs, int64_t cs, int64_t rows, int64_t k, int64_t kp) {
  Out* d = static_cast<Out*>(dst);
  const In* s = static_cast<const In*>(src);
  for (int64_t i = 0; i < rows; ++i) {
    Out* row = d + (i / R) * R * Stride + (i % R) * Stride;
    const In* from = s + i * rs;
    if (i + kPrefetchAhead < rows) prefetch_run(from + kPrefetchAhead * rs, k);
    for (int64_t kk = 0; kk < k; ++kk) row[kk] = pack_value(from[kk], row);
    for (int64_t kk = k; kk < kp; ++kk) row[kk] = Out{};
  }
}

// The packing a GemmKernels table takes, for source type In: ceil(rows / R) panels.
template <int R, int G, class Out, class In>
void pack_block(void* dst, const void* src, int64_t rs, int64_t cs, int64_t rows, int64_t k, int64_t kp) {
  pack_panels<R, G>(static_cast<Out*>(dst), static_cast<const In*>(src), rs, cs, rows, k, kp, (rows + R - 1) / R);
}

// Calls f.template operator()<M>() for the tile's row count m in [1, Mr]: microkernels are
// compiled per row count, so a short tile wastes no rows.
template <int Mr, int M = 1, class F>
void with_rows(int64_t m, F&& f) {
  if constexpr (M < Mr) {
    if (m != M) return with_rows<Mr, M + 1>(m, f);
  }
  f.template operator()<M>();
}

// The table of a broadcast microkernel over float32 panels (Mr x Nr, A panels k-major or, with
// tile_a_rows, in the "rows" format with rows Kc apart): In = float for float32 inputs,
// uint16_t for bfloat16 ones widened while packing.
template <int Mr, int Nr, int Kc, class In>
constexpr GemmKernels widening_kernels(int64_t mc, int64_t nc, GemmKernels::Tile tile, GemmKernels::Tile tile_a_rows) {
  return {.mr = Mr,
          .nr = Nr,
          .mc = mc,
          .nc = nc,
          .k_align = 1,
          .packed_bytes = 4,
          .pack_a = pack_block<Mr, 1, float, In>,
          .pack_b = pack_block<Nr, 1, float, In>,
          .tile = tile,
          .pack_a_rows = tile_a_rows != nullptr ? pack_rows<Mr, Kc, float, In> : nullptr,
          .tile_a_rows = tile_a_rows};
}

}  // namespace
}  // namespace dtr::cpu::internal
