// CUDA random fills: the CUDA half of kernels/random.h (uniform_, normal_, bernoulli).
//
// A thread per element of t (any strides over `shape`) draws the value at the element's
// global index, base + sum_d coord[d] * strides[d] (GlobalIndex, from the ShardLayout),
// with kernels/philox.h's own philox_uniform / philox_normal / philox_bernoulli and
// philox_affine, in double, and rounds it once to t's dtype: the CPU kernel's value for the
// same seed and global index. uniform and bernoulli are bitwise the CPU's; normal is within
// a few ulp of double of it (CUDA's log, cos and sin are not glibc's; kernels/README.md).
// Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/map_layout.h"
#include "core/dtype.h"

namespace dtr::cuda {

// Row-major global index of each local element: base + sum_d coord[d] * strides[d].
struct GlobalIndex {
  int64_t base = 0;
  int64_t strides[kMaxMapDims] = {};
};

// t = lo + scale * uniform (scale = hi - lo), floating dtypes.
void uniform(const MapOperand& t, const MapShape& shape, const GlobalIndex& global, double lo, double scale,
             uint64_t seed, DType dtype, int device, cudaStream_t stream);
// t = mean + std * standard normal (Box-Muller), floating dtypes.
void normal(const MapOperand& t, const MapShape& shape, const GlobalIndex& global, double mean, double std,
            uint64_t seed, DType dtype, int device, cudaStream_t stream);
// t = 1 with probability p, else 0; every dtype.
void bernoulli(const MapOperand& t, const MapShape& shape, const GlobalIndex& global, double p, uint64_t seed,
               DType dtype, int device, cudaStream_t stream);

}  // namespace dtr::cuda
