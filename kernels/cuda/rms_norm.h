// CUDA rms_norm and its backward: the CUDA half of kernels/rms_norm.h.
//
// x is `rows` contiguous rows of n elements; weight (nullptr when absent) n elements of x's
// dtype; rstd one value per row in the statistics' type (float, double for float64), which
// is also what every sum accumulates in. Forward: one block per row, one block-wide sum of
// x^2. Backward: grad_x per row from one block-wide sum (of g * xhat, g = grad_y * weight,
// xhat = x * rstd); grad_weight as column sums of grad_y * xhat over rows, in a fixed order
// whatever the launch (chunks of rows into `partials`, chunks x n statistics values of
// scratch, then chunk by chunk), so it is deterministic. Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtr::cuda {

// How many chunks of rows the backward's column sums use (the partials' length / n).
int64_t rms_norm_backward_chunks(int64_t rows);

void rms_norm(void* y, void* rstd, const void* x, const void* weight, int64_t rows, int64_t n, double eps, DType dtype,
              int device, cudaStream_t stream);
void rms_norm_backward(void* grad_x, void* grad_weight, const void* grad_y, const void* x, const void* rstd,
                       const void* weight, void* partials, int64_t rows, int64_t n, DType dtype, int device,
                       cudaStream_t stream);

}  // namespace dtr::cuda
