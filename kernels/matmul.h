// Matrix products of local tensors: matmul (2-D) and bmm (a batch of 2-D products).
//
// matmul: [M, K] x [K, N] -> [M, N]; bmm: [B, M, K] x [B, K, N] -> [B, M, N], a new
// contiguous tensor, or a caller's tensor with the _out forms (ATen's mm_out): reusing
// one avoids the page faults a fresh large result costs (~9% of a [2048, 1024] x
// [1024, 4096] float32 product here), so _out runs at Eigen's own speed. An operand may be row-major or a transposed view (x.t(),
// x.transpose(-1, -2)): both map into Eigen's GEMM without a copy (any leading dimension
// >= the row length); only other strides are copied to contiguous first. float32 and
// float64 multiply natively; bfloat16 and float16 operands are converted to float32,
// multiplied with float32 accumulation and rounded once. Runs on num_threads() threads
// (kernels/parallel.h). (torch.mm and torch.bmm, over Eigen's `C.noalias() = A * B`.)
#pragma once

#include "kernels/tensor.h"

namespace dtr {

// a [M, K] times b [K, N]; ValueError naming both shapes if they do not chain.
Tensor matmul(const Tensor& a, const Tensor& b);

// a [B, M, K] times b [B, K, N], batch by batch; ValueError naming both shapes otherwise.
Tensor bmm(const Tensor& a, const Tensor& b);

// Overwrites out with a b. out must be contiguous, of the result's shape, a's dtype and
// device, and share no storage with a or b (ValueError/TypeError otherwise).
const Tensor& matmul_out(const Tensor& out, const Tensor& a, const Tensor& b);
const Tensor& bmm_out(const Tensor& out, const Tensor& a, const Tensor& b);

}  // namespace dtr
