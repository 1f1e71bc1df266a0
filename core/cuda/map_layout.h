// MapShape and MapOperand: how a CUDA map kernel (elementwise.h, fill_copy.h's copy) reads
// its operands: the output's shape (at most kMaxMapDims dims), and for each operand a
// pointer and its strides in elements over that shape (0 where it broadcasts).
#pragma once

#include <cstdint>

namespace dtr::cuda {

inline constexpr int kMaxMapDims = 8;

struct MapShape {
  int ndim = 0;
  int64_t sizes[kMaxMapDims] = {};
  int64_t numel = 1;
};

struct MapOperand {
  void* data = nullptr;
  int64_t strides[kMaxMapDims] = {};  // in elements, over MapShape's sizes
};

// Whether `o` is laid out densely in row-major order over `shape` (size-1 dims ignored).
inline bool contiguous_over(const MapOperand& o, const MapShape& shape) {
  int64_t expected = 1;
  for (int d = shape.ndim - 1; d >= 0; --d) {
    if (shape.sizes[d] != 1 && o.strides[d] != expected) return false;
    expected *= shape.sizes[d];
  }
  return true;
}

}  // namespace dtr::cuda
