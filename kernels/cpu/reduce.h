// CPU reduction kernels: the CPU half of kernels/reduce.h.
//
// out has x's rank with size 1 on every reduced dim (the keepdim shape) and is
// contiguous; the Tensor-level op has checked dims, emptiness and devices. Values
// accumulate in a buffer of the accumulation type (float64 for float32, float for
// bfloat16/float16, int64 for integers) and are converted into out once at the end.
// Iteration follows x's memory order. Reducing the leading dims of a contiguous x adds
// four contiguous rows at a time into a row of accumulators (ATen's outer reduction); a run
// that folds into one accumulator (the last dim) keeps 64 partial results, element i in
// lane i % 64 and the tail in lane 0, folded into the accumulator in lane order at the end.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/reduce_kind.h"

namespace dtr::cpu {

// out = op over the dims where out has size 1 and x does not.
void reduce(const Tensor& out, const Tensor& x, ReduceKind op);
// acc [C] (sum's accumulator dtype) += x [R, C] summed over its rows, folded as reduce's sum.
void sum_rows_accumulate(const Tensor& acc, const Tensor& x);
// out (int64, keepdim shape) = index along dim of the first maximum of x.
void argmax(const Tensor& out, const Tensor& x, int64_t dim);

}  // namespace dtr::cpu
