// CUDA launchers for the two kernels every tensor needs: fill and a dtype-converting copy.
//
// Both take raw pointers to contiguous memory on one device and run on that device's
// default stream, the only one dtr's CUDA kernels use. Conversions round like the CPU
// kernels (bf16/f16 round-to-nearest-even), so the CPU implementation is their reference.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace dtr::cuda {

void fill(int device, void* dst, DType dtype, int64_t n, double value);
void cast(int device, void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n);

}  // namespace dtr::cuda
