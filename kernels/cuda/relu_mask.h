// CUDA kernels of kernels/relu_mask.h: the same words as the CPU's (bit j of word w for
// element 32 w + j, set where y is not <= 0), on contiguous operands. Queued on `stream`.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace dtr::cuda {

// words: ceil(n / 32) of them; y: n elements of `dtype` (floating).
void relu_mask(uint32_t* words, const void* y, int64_t n, DType dtype, int device, cudaStream_t stream);
// Zeroes grad[i] (n elements of `dtype`) where bit i of words is clear.
void apply_relu_mask(void* grad, const uint32_t* words, int64_t n, DType dtype, int device, cudaStream_t stream);

}  // namespace dtr::cuda
