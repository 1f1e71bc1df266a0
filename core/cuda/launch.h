// Grid sizing for grid-stride kernels: kThreads per block, enough blocks for `work` items
// (one per thread, or one per block for row kernels) up to a cap past which they loop.
#pragma once

#include <cstdint>

namespace dtr::cuda::internal {

inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = 65535 * 8;

inline int blocks_for(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : b < kMaxBlocks ? b : kMaxBlocks);
}

// One block per item (a row, a position), up to the cap past which blocks loop.
inline int blocks_for_rows(int64_t rows) {
  return static_cast<int>(rows < 1 ? 1 : rows < kMaxBlocks ? rows : kMaxBlocks);
}

}  // namespace dtr::cuda::internal
