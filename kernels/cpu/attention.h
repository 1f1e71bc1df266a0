// CPU kernels of fused attention and its backward (kernels/attention.h). Inputs are 3-D
// [B, T, E] views of one floating dtype on the CPU, any strides, already checked; outputs are
// contiguous, of the right shapes and dtypes, and are overwritten (lse is acc_dtype).
//
// Forward: a thread takes blocks of 16 query rows and walks the visible keys in tiles of 64,
// each row keeping a running max, sum of exponentials and output accumulator (online
// softmax). Backward: D = rowsum(grad_out * out) per row; grad_q by query blocks over key
// tiles; grad_k and grad_v by key blocks over query tiles, each recomputing P and dS from lse.
// Math in float (double for float64), rounded once on store. Each output element is summed by
// one thread in an order fixed by the sizes alone: bitwise the same on any thread count.
#pragma once

#include "core/tensor.h"
#include "kernels/causal.h"

namespace dtr::cpu {

void attention(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, Causal causal,
               double scale, int64_t query_offset);

void attention_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        Causal causal, double scale, int64_t query_offset);

}  // namespace dtr::cpu
