// store_row: a row kernel's results, computed in Acc, written to the output's element type.
//
// Rows of an output larger than the caches are streamed (stream_store.h: no read for
// ownership); others are stored directly. A row of 16-bit floats is converted into a
// staging block on the stack a kStageBytes piece at a time, each piece then streamed. The
// thread that streamed calls stream_fence() before its rows are read by others.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cpu/convert_block.h"
#include "core/cpu/stream_store.h"

namespace dtr::cpu {

// Bytes of a converted row staged at a time (a multiple of a cache line).
inline constexpr int64_t kStageBytes = 2048;

// out[0, n) = convert<T>(row[0, n)).
template <class T, class Acc>
[[gnu::always_inline]] inline void store_row(const Acc* row, T* out, int64_t n, bool streaming) {
  if (!streaming) {
    if constexpr (!std::is_same_v<T, Acc>) {
      convert_block(row, out, n);
    } else if (row != out) {
      for (int64_t i = 0; i < n; ++i) out[i] = row[i];
    }
    return;
  }
  if constexpr (std::is_same_v<T, Acc>) {
    stream_store(out, row, n * static_cast<int64_t>(sizeof(T)));
  } else {
    constexpr int64_t kStage = kStageBytes / static_cast<int64_t>(sizeof(T));
    alignas(64) T staged[kStage];
    for (int64_t i = 0; i < n; i += kStage) {
      const int64_t m = std::min(kStage, n - i);
      convert_block(row + i, staged, m);
      stream_store(out + i, staged, m * static_cast<int64_t>(sizeof(T)));
    }
  }
}

}  // namespace dtr::cpu
