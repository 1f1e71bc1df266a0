// CUDA softmax and log_softmax with their backward: the CUDA half of kernels/softmax.h.
//
// Rows of `cols` contiguous elements, `rows` of them back to back (the Tensor-level op moves
// the softmax dim last); one block of 256 threads per row. Forward: one pass keeps a
// running max and the sum of exp relative to it (online softmax), a second writes
// exp(x - max) / sum or x - max - log(sum). Backward: softmax's grad_x = y (grad_y -
// sum(grad_y y)), log_softmax's grad_x = grad_y - exp(y) sum(grad_y). bfloat16/float16
// compute in float, float32 in float, float64 in double. Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/softmax_kind.h"

namespace dtr::cuda {

void softmax(void* y, const void* x, int64_t rows, int64_t cols, DType dtype, SoftmaxKind kind, int device,
             cudaStream_t stream);
void softmax_backward(void* grad_x, const void* grad_y, const void* y, int64_t rows, int64_t cols, DType dtype,
                      SoftmaxKind kind, int device, cudaStream_t stream);

}  // namespace dtr::cuda
