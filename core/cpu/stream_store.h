// stream_store: copying a block of results to its destination with non-temporal stores.
//
// An ordinary store first reads the destination line into the cache (read for ownership),
// so a kernel writing a large output moves its bytes twice; a streaming store writes the
// line to memory without reading it (what memcpy does for large copies). Kernels whose
// output exceeds the caches compute a block into L1 and stream it out. Streamed bytes are
// weakly ordered: the thread that wrote them calls stream_fence() before others read them.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace dtr::cpu {

// Outputs of at least this many bytes are written with streaming stores: they exceed this
// machine's L2 several times over, so they would leave the caches before being read again.
inline constexpr int64_t kStreamFrom = int64_t{8} << 20;

// Whether an output of `bytes` bytes is streamed.
inline bool streams_output(int64_t bytes) { return bytes >= kStreamFrom; }

// dst[0, bytes) = src[0, bytes): streaming stores for the 64-byte-aligned lines of dst,
// plain ones for the partial lines at either end.
[[gnu::always_inline]] inline void stream_store(void* dst, const void* src, int64_t bytes) {
#if defined(__AVX__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const int64_t head = std::min<int64_t>(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + i));
#else
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32)));
#endif
  }
  std::memcpy(d + i, s + i, static_cast<size_t>(bytes - i));
#else
  std::memcpy(dst, src, static_cast<size_t>(bytes));
#endif
}

// Orders this thread's streaming stores before its later stores (and so before any
// synchronisation that publishes them).
inline void stream_fence() {
#if defined(__AVX__)
  _mm_sfence();
#endif
}

}  // namespace dtr::cpu
