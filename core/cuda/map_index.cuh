// The offsets of N operands' elements at a map kernel's linear index i (row-major over the
// shape), from their strides: one division per dim, shared by every operand.
#pragma once

#include "core/cuda/map_layout.h"

namespace dtr::cuda::internal {

template <int N>
__device__ inline void map_offsets(const MapShape& shape, const MapOperand* const (&operands)[N], int64_t i,
                                   int64_t (&offsets)[N]) {
  for (int k = 0; k < N; ++k) offsets[k] = 0;
  for (int d = shape.ndim - 1; d >= 0; --d) {
    const int64_t index = i % shape.sizes[d];
    i /= shape.sizes[d];
    for (int k = 0; k < N; ++k) offsets[k] += index * operands[k]->strides[d];
  }
}

}  // namespace dtr::cuda::internal
