// store_row: a row kernel's results, computed in Acc, written to the output's element type.
//
// Rows of an output larger than the caches are streamed (stream_store.h: no read for
// ownership); others are stored directly. A row of 16-bit floats is converted in place,
// front to back (each T is smaller than its Acc, so no value is overwritten before it is
// read), then streamed. The thread that streamed calls stream_fence() before its rows are
// read by others.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/internal/convert_block.h"
#include "kernels/cpu/internal/stream_store.h"

namespace dtr::cpu {

// Whether rows of an output of `bytes` bytes are streamed.
inline bool streams_rows(int64_t bytes) { return bytes >= kStreamFrom; }

// out[0, n) = convert<T>(row[0, n)); row may be overwritten (when T is not Acc and streaming).
template <class T, class Acc>
[[gnu::always_inline]] inline void store_row(Acc* row, T* out, int64_t n, bool streaming) {
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
    T* staged = reinterpret_cast<T*>(row);
    convert_block(row, staged, n);
    stream_store(out, staged, n * static_cast<int64_t>(sizeof(T)));
  }
}

}  // namespace dtr::cpu
