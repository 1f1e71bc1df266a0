// CPU kernels of matmul, bmm and matmul_bias (kernels/matmul.h): dtr's GEMM (cpu/gemm.h) for
// float32, bfloat16 (float32 accumulation) and float16 (through float32), Eigen's for float64,
// reading row-major or transposed operands in place, written into a contiguous result.
// Shapes, dtypes, devices and aliasing have been checked by the caller; a 2-D product is a
// batch of one.
#pragma once

#include "core/tensor.h"
#include "kernels/matmul.h"

namespace dtr::cpu {

// out [B, M, N] (contiguous, a's dtype) = a [B, M, K] times b [B, K, N].
void bmm(const Tensor& out, const Tensor& a, const Tensor& b);

// out [M, N] (contiguous) = epilogue(a [M, K] b [K, N] + bias [N]), rounding as matmul, add
// and gelu do (the reference of the CUDA epilogues): float32 adds the bias in the GEMM's
// epilogue (one rounding, as add's pass), other dtypes in a pass; the GELU is a pass. pre, if
// defined ([M, N], any strides), receives a b + bias.
// acc [M, N] (contiguous float32; float64 for float64 operands) += a [M, K] b [K, N]: the
// GEMM with beta 1 (float16 through float32, float64 a product and an add).
void matmul_accumulate(const Tensor& acc, const Tensor& a, const Tensor& b);

void matmul_bias(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b, const Tensor& bias,
                 MatmulEpilogue epilogue);

}  // namespace dtr::cpu
