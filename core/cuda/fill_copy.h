// CUDA launchers for the two kernels every tensor needs, fill and a dtype-converting copy,
// and arange's.
//
// Both are queued on `stream` (the caller's current stream, stream.h). fill takes
// contiguous memory; copy any layout (map_layout.h: strides over the destination's shape,
// 0 where the source broadcasts), contiguous pairs on a flat loop. Conversions round like
// the CPU kernels (bf16/f16 round-to-nearest-even), so the CPU implementation is their
// reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/map_layout.h"
#include "core/dtype.h"

namespace dtr::cuda {

// dst[i] = value for i in [0, n), on `device`.
void fill(void* dst, DType dtype, int64_t n, double value, int device, cudaStream_t stream);
// dst[i] = convert(fma(i, step, start)) for i in [0, n): arange's values, the CPU's formula
// (kernels/fill.cc) with the same single rounding.
void arange(void* dst, DType dtype, int64_t n, double start, double step, int device, cudaStream_t stream);
// dst = convert(src) elementwise over `shape`; dst and src on `device`, not overlapping
// (unless equal).
void copy(const MapOperand& dst, DType dst_dtype, const MapOperand& src, DType src_dtype, const MapShape& shape,
          int device, cudaStream_t stream);

}  // namespace dtr::cuda
