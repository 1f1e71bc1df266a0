// Grid sizing for grid-stride kernels: kThreads per block, enough blocks for `work` items
// (one per thread) up to a cap past which threads loop.
#pragma once

#include <cstdint>

namespace dtr::cuda::internal {

inline constexpr int kThreads = 256;

inline int blocks_for(int64_t work) {
  constexpr int64_t kMaxBlocks = 65535 * 8;
  const int64_t b = (work + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : b < kMaxBlocks ? b : kMaxBlocks);
}

}  // namespace dtr::cuda::internal
