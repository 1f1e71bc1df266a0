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

std::vector<ChunkRange> strided_rows(int64_t size, int64_t split_factor, int64_t num_chunks, int64_t index) {
  DTR_CHECK(split_factor >= 1, ValueError,
            "strided_rows: split factor {} for a dim of length {}; it counts blocks and must be >= 1", split_factor,
            size);
  std::vector<ChunkRange> rows;
  for (int64_t b = 0; b < split_factor; ++b) {
    const ChunkRange block = chunk_range(size, split_factor, b);
    const ChunkRange part = chunk_range(block.length, num_chunks, index);
    if (part.length > 0) rows.push_back({block.offset + part.offset, part.length});
  }
  return rows;
}

int64_t strided_capacity(int64_t size, int64_t split_factor, int64_t num_chunks) {
  // Chunk 0 of every block is its longest.
  return ranges_length(strided_rows(size, split_factor, num_chunks, 0));
}

std::vector<ChunkRange> slice_ranges(std::span<const ChunkRange> ranges, int64_t begin, int64_t length) {
  std::vector<ChunkRange> out;
  int64_t at = 0;  // local position of the current range's first element
  for (const ChunkRange& r : ranges) {
    const int64_t from = std::max(begin, at), to = std::min(begin + length, at + r.length);
    if (from < to) out.push_back({r.offset + (from - at), to - from});
    at += r.length;
  }
  return out;
}

int64_t ranges_length(std::span<const ChunkRange> ranges) {
  int64_t n = 0;
  for (const ChunkRange& r : ranges) n += r.length;
  return n;
}

}  // namespace dtr
