#include "dtensor/chunking.h"

#include <algorithm>

#include "core/error.h"

namespace dtr {

int64_t chunk_capacity(int64_t size, int64_t num_chunks) {
  DTR_CHECK(size >= 0 && num_chunks >= 1, ValueError,
            "chunk_capacity: cannot split a dim of length {} into {} chunks; the length must be >= 0 and the number "
            "of chunks >= 1",
            size, num_chunks);
  return (size + num_chunks - 1) / num_chunks;
}

ChunkRange chunk_range(int64_t size, int64_t num_chunks, int64_t index) {
  DTR_CHECK(index >= 0 && index < num_chunks, IndexError,
            "chunk_range: chunk {} of a dim of length {} split into {} chunks; chunks run from 0 to {}", index, size,
            num_chunks, num_chunks - 1);
  const int64_t capacity = chunk_capacity(size, num_chunks);
  const int64_t begin = std::min(size, index * capacity);
  const int64_t end = std::min(size, begin + capacity);
  return {begin, end - begin};
}

std::vector<ChunkRange> nested_chunks(int64_t size, std::span<const int64_t> sizes) {
  std::vector<ChunkRange> chunks = {{0, size}};
  for (int64_t n : sizes) {
    std::vector<ChunkRange> finer;
    for (const ChunkRange& outer : chunks) {
      for (int64_t k = 0; k < n; ++k) {
        const ChunkRange inner = chunk_range(outer.length, n, k);
        finer.push_back({outer.offset + inner.offset, inner.length});
      }
    }
    chunks = std::move(finer);
  }
  return chunks;
}

}  // namespace dtr
