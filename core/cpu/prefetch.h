// prefetch_to_l2 and read_ahead: asking for memory before a kernel reads it.
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

// Asks for every cache line that [p, p + bytes) touches, with __builtin_prefetch's
// locality kLocality (3: into L1, 2: into L2).
template <int kLocality>
inline void prefetch_lines(const void* p, int64_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = begin + static_cast<uintptr_t>(bytes);
  for (uintptr_t line = begin & ~uintptr_t{kCacheLine - 1}; line < end; line += kCacheLine) {
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, kLocality);
  }
}

// Asks for every cache line that [p, p + bytes) touches, into L2.
inline void prefetch_to_l2(const void* p, int64_t bytes) { prefetch_lines<2>(p, bytes); }

// How far ahead of a sequential read read_ahead asks for lines. On Zen 3 the hardware
// prefetcher alone holds a single read stream well below what the memory delivers; 4 KiB
// ahead gains more than 1 KiB, and 8 KiB no more than 4 (docs/kernel_bench.md, "Reductions").
inline constexpr int64_t kReadAhead = 4096;

// Asks for the lines kReadAhead bytes past [p, p + bytes): called once per step of a
// loop reading forward through memory, bytes being the step. Past the end of the data
// it asks for lines nobody reads, which costs a little bandwidth and no fault.
inline void read_ahead(const void* p, int64_t bytes) {
  prefetch_lines<3>(static_cast<const char*>(p) + kReadAhead, bytes);
}

}  // namespace dtr::cpu
