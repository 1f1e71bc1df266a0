// CUDA layer_norm and its backward: the CUDA half of kernels/layer_norm.h.
//
// x is `rows` contiguous rows of n elements; weight and bias (nullptr when absent) n
// elements of x's dtype; mean and rstd one value per row in the statistics' type (float,
// double for float64), which is also what every sum accumulates in. Forward: one block per
// row, two block-wide sums (the mean, then the variance of x - mean: no cancellation).
// Backward: grad_x per row from two block-wide sums (of g and of g * xhat, g = grad_y *
// weight); grad_weight and grad_bias as column sums over rows, in a fixed order whatever the
// launch (blocks of rows into `partials`, 2 x chunks x n statistics values of scratch, then
// chunk by chunk), so they are deterministic. Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtr::cuda {

// How many chunks of rows the backward's column sums use (the partials' length / (2 n)).
int64_t layer_norm_backward_chunks(int64_t rows);

void layer_norm(void* y, void* mean, void* rstd, const void* x, const void* weight, const void* bias, int64_t rows,
                int64_t n, double eps, DType dtype, int device, cudaStream_t stream);
void layer_norm_backward(void* grad_x, void* grad_weight, void* grad_bias, const void* grad_y, const void* x,
                         const void* mean, const void* rstd, const void* weight, void* partials, int64_t rows,
                         int64_t n, DType dtype, int device, cudaStream_t stream);

}  // namespace dtr::cuda
