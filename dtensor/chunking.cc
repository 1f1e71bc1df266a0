#include "dtensor/chunking.h"

#include <algorithm>

#include "kernels/error.h"

namespace dtr {

int64_t chunk_capacity(int64_t size, int64_t num_chunks) {
  DTR_INTERNAL_ASSERT(size >= 0 && num_chunks >= 1, "chunk_capacity({}, {})", size, num_chunks);
  return (size + num_chunks - 1) / num_chunks;
}

ChunkRange chunk_range(int64_t size, int64_t num_chunks, int64_t index) {
  DTR_INTERNAL_ASSERT(index >= 0 && index < num_chunks, "chunk {} of {}", index, num_chunks);
  const int64_t capacity = chunk_capacity(size, num_chunks);
  const int64_t begin = std::min(size, index * capacity);
  const int64_t end = std::min(size, begin + capacity);
  return {begin, end - begin};
}

}  // namespace dtr
