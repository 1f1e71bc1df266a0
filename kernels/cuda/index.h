// CUDA gather and scatter-add along a dim: the CUDA half of kernels/index.h (what
// kernels/cpu/index.h computes, in the same order).
//
// Operands are pointers with their strides in elements over index's `shape` (the
// MapShape), any strides: `a` has index's shape (out for gather, src for scatter_add),
// `x` is indexed along `dim` (its stride along dim is x.strides[dim]; index.size(d) <=
// x.size(d) elsewhere). gather: a thread per element of index. scatter_add: a thread per
// position of the slice (every dim but dim) that walks k along dim in order, so repeated
// indices add in index order and no two threads write one element of x (distinct slice
// positions name distinct columns of x): no atomics, the CPU's bits whatever the launch.
// The index check: check_index sets *bad (an int32 the caller zeroed and reads back) when
// an index lies outside [0, size); gather and scatter_add, queued after it, do nothing when
// *bad is set, so a bad index reads or writes nothing. Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/map_layout.h"
#include "core/dtype.h"

namespace dtr::cuda {

// *bad = 1 when an element of index (int32 or int64, over `shape`) is outside [0, size).
void check_index(int32_t* bad, const MapOperand& index, DType index_dtype, const MapShape& shape, int64_t size,
                 int device, cudaStream_t stream);

// out[.., k, ..] = x[.., index[.., k, ..], ..] along dim, over index's shape.
void gather(const MapOperand& out, const MapOperand& x, const MapOperand& index, DType index_dtype,
            const MapShape& shape, int dim, const int32_t* bad, DType dtype, int device, cudaStream_t stream);

// x[.., index[.., k, ..], ..] += src[.., k, ..] along dim, over index's shape, computed in
// acc_t (float for bf16/f16).
void scatter_add(const MapOperand& x, const MapOperand& index, DType index_dtype, const MapOperand& src,
                 const MapShape& shape, int dim, const int32_t* bad, DType dtype, int device, cudaStream_t stream);

}  // namespace dtr::cuda
