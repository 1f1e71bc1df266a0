// CUDA reduction kernels: the CUDA half of kernels/reduce.h (sum, mean, max, min,
// sum_of_squares over any set of dims, and argmax over one).
//
// x's elements are addressed by two map layouts: `kept` (the dims not reduced, in order:
// one output element each) and `reduced` (the dims each output element reduces), each
// with x's strides over it. out is contiguous, kept.numel elements. A warp reduces each
// output element when it reduces few elements, a block of 256 threads when it reduces many
// (shuffles within warps, shared memory across them). Accumulation as on the CPU: double for
// float32/float64, float for bfloat16/float16 (rounded once at the end), int64 for integers
// and bool, whose sum is int64. A NaN makes max and min NaN. Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/map_layout.h"
#include "core/dtype.h"
#include "kernels/reduce_kind.h"

namespace dtr::cuda {

struct ReduceLayout {
  MapShape kept, reduced;
  MapOperand x_kept, x_reduced;  // x's strides over each; x_kept.data is x's data
};

// out's dtype: int64 for the sum of an integer or bool x, x's dtype otherwise.
void reduce(void* out, const ReduceLayout& layout, DType dtype, ReduceKind op, int device, cudaStream_t stream);
// out (int64, kept.numel elements) = the index within the reduced elements (one dim) of
// the first maximum; a NaN counts as the maximum (the first NaN wins). A warp per output.
void argmax(int64_t* out, const ReduceLayout& layout, DType dtype, int device, cudaStream_t stream);

}  // namespace dtr::cuda
