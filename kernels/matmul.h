// Matrix products of local tensors: matmul (2-D) and bmm (a batch of 2-D products).
//
// matmul: [M, K] x [K, N] -> [M, N]; bmm: [B, M, K] x [B, K, N] -> [B, M, N], into a new
// contiguous tensor, or into the caller's with the _out forms (ATen's mm_out), which run
// at Eigen's own speed: a fresh large result costs its page faults. Row-major or transposed
// operand views (x.t(), x.transpose(-1, -2)) map into Eigen's GEMM without a copy, with any
// leading dimension; other strides are copied first. float32 and float64 multiply
// natively; bfloat16 and float16 go through float32 (one rounding). Threads: num_threads().
// (torch.mm and torch.bmm, over Eigen's `C.noalias() = A * B`.) On CUDA: one cuBLASLt call
// (kernels/cuda/matmul.h), bf16/f16 on tensor cores with float32 accumulation, float32 in
// float32 unless set_matmul_allow_tf32(true).
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

// Whether CUDA float32 products may use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32;
// default false). Process-wide.
void set_matmul_allow_tf32(bool allow);
bool matmul_allow_tf32();

}  // namespace dtr
