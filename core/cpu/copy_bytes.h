// copy_bytes: memcpy for the pieces kernels copy out of memory beyond the caches (rows of a
// cat, runs of a narrowed view, gathered rows).
//
// Debian 12's glibc (2.36) copies pieces of 257 B to 2 KiB with its own vector loop, which
// is slower than plain 32-byte moves in order where the pieces stream from memory; up to
// 256 B its few overlapping moves are as fast, and from about 3 KiB its other paths match
// the moves. So pieces of 257 B to 8 KiB go through copy_line (figures:
// docs/kernel_bench.md, "Pieces of 257 B to 8 KiB").
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace dtr::cpu {

// dst[0, 64) = src[0, 64), in two 32-byte moves (GCC's tuning for this CPU splits a
// 64-byte memcpy into four 16-byte ones).
[[gnu::always_inline]] inline void copy_line(char* dst, const char* src) {
#if defined(__AVX__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32),
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32)));
#else
  std::memcpy(dst, src, 64);
#endif
}

// Pieces of more than kCopyLinesFrom and at most kCopyLinesTo bytes go through copy_line.
inline constexpr int64_t kCopyLinesFrom = 256, kCopyLinesTo = int64_t{8} << 10;

// dst[0, bytes) = src[0, bytes); the two do not overlap.
inline void copy_bytes(void* dst, const void* src, int64_t bytes) {
  if (bytes <= kCopyLinesFrom || bytes > kCopyLinesTo) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  int64_t i = 0;
  for (; i + 64 <= bytes; i += 64) copy_line(d + i, s + i);
  std::memcpy(d + i, s + i, static_cast<size_t>(bytes - i));
}

}  // namespace dtr::cpu
