// CUDA embedding and its deterministic backward: the CUDA half of kernels/embedding.h.
//
// weight is [num_rows, dim] contiguous; indices (int32 or int64, `positions` of them)
// contiguous and already checked to lie in [0, num_rows). Forward: a block per position
// copies its row. Backward: the (index, position) pairs are sorted by index with CUB's
// stable radix sort, so each index's positions stay in increasing order; a block per run of
// one index sums those gradient rows in that order (in float, double for float64): the same
// order as the CPU kernel, so the result is the same bit for bit whatever the launch. Rows
// no position holds, and padding_idx's (-1: none), are zero. Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace dtr::cuda {

void embedding(void* out, const void* weight, const void* indices, DType index_dtype, int64_t positions, int64_t dim,
               DType dtype, int device, cudaStream_t stream);

// Bytes of device scratch embedding_backward needs for `positions` indices.
size_t embedding_backward_scratch_bytes(int64_t positions, int device);

void embedding_backward(void* out, const void* grad, const void* indices, DType index_dtype, int64_t positions,
                        int64_t dim, int64_t num_rows, int64_t padding_idx, void* scratch, size_t scratch_bytes,
                        DType dtype, int device, cudaStream_t stream);

}  // namespace dtr::cuda
