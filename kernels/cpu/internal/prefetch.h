// prefetch_to_l2: asking for memory before a kernel reads it.
//
// A row kernel whose passes over a row are compute-bound (softmax's exponentials) leaves
// the memory bus idle while it computes, then stalls on the next row's first pass; the
// hardware prefetcher only follows streams already being read. Asking for the next row's
// lines a chunk at a time during the current row's compute overlaps the two (prefetcht1:
// into L2, which holds a row of a transformer's width or vocabulary alongside the current
// one). A prefetch never faults and changes no value.
#pragma once

#include <cstdint>

namespace dtr::cpu {

inline constexpr int64_t kCacheLine = 64;

// Asks for every cache line that [p, p + bytes) touches.
inline void prefetch_to_l2(const void* p, int64_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = begin + static_cast<uintptr_t>(bytes);
  for (uintptr_t line = begin & ~uintptr_t{kCacheLine - 1}; line < end; line += kCacheLine) {
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 2);
  }
}

}  // namespace dtr::cpu
