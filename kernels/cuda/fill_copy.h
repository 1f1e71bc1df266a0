// CUDA launchers for the two kernels every tensor needs: fill and a dtype-converting copy.
//
// Both take raw pointers to contiguous memory on one device and are queued on `stream`
// (the caller's current stream, stream.h). Conversions round like the CPU kernels
// (bf16/f16 round-to-nearest-even), so the CPU implementation is their reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace dtr::cuda {

// dst[i] = value for i in [0, n), on `device`.
void fill(void* dst, DType dtype, int64_t n, double value, int device, cudaStream_t stream);
// dst[i] = convert(src[i]) for i in [0, n); dst and src on `device`.
void cast(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n, int device, cudaStream_t stream);

}  // namespace dtr::cuda
