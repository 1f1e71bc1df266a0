// Reductions of local tensors over any set of dims: sum, mean, max, min, sum_of_squares,
// and argmax over one dim (PyTorch's semantics).
//
// dims lists the dims to reduce: negative dims wrap, an empty list means every dim, a
// repeated dim is a ValueError. KeepDim::kYes keeps each reduced dim with size 1.
// Accumulation: float64 for float32/float64 inputs, float for bfloat16/float16 (rounded
// once at the end), int64 for integers and bool; the sum of an integer or bool tensor is
// int64, as in torch. Over an empty dim: sum is 0, mean NaN, and max, min and argmax raise
// ValueError (the max of nothing is undefined). CUDA kernels: kernels/cuda/reduce.h.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dtr {

// Whether a reduction keeps the reduced dims with size 1 (torch's keepdim=True).
enum class KeepDim : uint8_t { kNo, kYes };

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
// Floating dtypes.
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
// Largest / smallest value (torch.amax / amin); a NaN makes the result NaN.
Tensor max(const Tensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
Tensor min(const Tensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
// sum(x * x) without the intermediate tensor (gradient norms). Floating dtypes.
Tensor sum_of_squares(const Tensor& x, const std::vector<int64_t>& dims = {}, KeepDim keepdim = KeepDim::kNo);
// acc [C] += x [R, C] summed over its rows, with acc sum's accumulator for x (float64 for
// float32 and float64, float32 for bfloat16 and float16; contiguous, on x's device). For a
// sum over row chunks (a bias gradient of a chunked loss): on the CPU the rows of a
// contiguous x fold four at a time from each call's first row, as sum folds them, so calls
// over consecutive chunks of multiples of 4 rows, from acc = 0, leave acc with the bits of
// sum's own accumulator, and acc.to(x.dtype()) is sum(x, {0}). On CUDA: acc and x's rows
// summed in one reduction. Floating dtypes.
void sum_rows_accumulate(const Tensor& acc, const Tensor& x);
// sum's accumulator dtype for floating x: float64 for float32 and float64, float32 for
// bfloat16 and float16.
DType sum_acc_dtype(DType x);
// int64 index along dim of the first maximum; a NaN counts as the maximum. Numeric dtypes.
Tensor argmax(const Tensor& x, int64_t dim, KeepDim keepdim = KeepDim::kNo);

}  // namespace dtr
