// gather_rows: copying rows that lie scattered in memory (an embedding's or index_select's
// table) into consecutive places.
//
// A row copied on its own from beyond the caches starts a stream of its own: its first
// lines wait for memory's full latency while the hardware prefetcher finds the stream
// again, row after row. Copying kRowsAtOnce rows side by side, a cache line of each in
// turn, keeps that many streams in flight, and the next group's lines are asked for as the
// current group's are copied, so a group's first lines do not wait either. Four rows at
// once gain over one at every row size from 256 B to 64 KiB, and more than two or eight
// (figures: docs/kernel_bench.md, "Gathered rows").
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/cpu/copy_bytes.h"
#include "core/cpu/prefetch.h"

namespace dtr::cpu {

inline constexpr int64_t kRowsAtOnce = 4;

// For k in [0, count): dst + k * dst_stride gets the row_bytes at row_at(k).
template <class RowAt>
void gather_rows(char* dst, int64_t dst_stride, int64_t count, int64_t row_bytes, RowAt&& row_at) {
  constexpr int64_t g = kRowsAtOnce;
  int64_t k = 0;
  for (; k + g <= count; k += g) {
    const char* src[g];
    const char* next[g];  // the next group's rows (the last row again at the end)
#pragma GCC unroll 4      // kRowsAtOnce
    for (int64_t q = 0; q < g; ++q) {
      src[q] = row_at(k + q);
      next[q] = row_at(std::min(k + g + q, count - 1));
    }
    char* out = dst + k * dst_stride;
    int64_t b = 0;
    for (; b + kCacheLine <= row_bytes; b += kCacheLine) {
#pragma GCC unroll 4  // kRowsAtOnce
      for (int64_t q = 0; q < g; ++q) {
        __builtin_prefetch(next[q] + b, 0, 3);
        copy_line(out + q * dst_stride + b, src[q] + b);
      }
    }
    for (int64_t q = 0; q < g; ++q) {
      std::memcpy(out + q * dst_stride + b, src[q] + b, static_cast<size_t>(row_bytes - b));
    }
  }
  for (; k < count; ++k) copy_bytes(dst + k * dst_stride, row_at(k), row_bytes);
}

}  // namespace dtr::cpu
