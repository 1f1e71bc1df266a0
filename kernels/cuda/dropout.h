// CUDA masked scale under dropout and its backward: the CUDA half of kernels/dropout.h (the
// mask itself is kernels/random.h's bernoulli, drawn on the device bit for bit as the CPU's).
//
// out[i] = mask[i] ? x[i] * scale : 0 over `shape`, the product in float (double for
// float64) and rounded once to the dtype, as kernels/cpu/dropout.h computes it: the same
// bits. x and mask at any strides (map_layout.h), out written, never accumulated into.
// Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include "core/cuda/map_layout.h"
#include "core/dtype.h"

namespace dtr::cuda {

// x's dtype is `dtype` (floating); mask is bool.
void masked_scale(const MapOperand& out, const MapOperand& x, const MapOperand& mask, const MapShape& shape,
                  double scale, DType dtype, int device, cudaStream_t stream);

}  // namespace dtr::cuda
