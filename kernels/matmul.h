// Matrix products of local tensors: matmul (2-D) and bmm (a batch of 2-D products).
//
// matmul: [M, K] x [K, N] -> [M, N]; bmm: [B, M, K] x [B, K, N] -> [B, M, N], into a new
// contiguous tensor, or into the caller's with the _out forms (ATen's mm_out), which run
// at the GEMM's own speed: a fresh large result costs its page faults. Row-major or
// transposed operand views (x.t(), x.transpose(-1, -2)) are read in place, with any leading
// dimension; other strides are copied first. On the CPU float32 runs dtr's GEMM
// (kernels/cpu/gemm.h, per-ISA microkernels chosen at run time), bfloat16 the same GEMM with
// float32 accumulation (AMX tiles where the CPU has them) rounded once, float16 goes through
// float32 (one rounding), float64 runs Eigen's. Threads: num_threads(). (torch.mm and
// torch.bmm.) On CUDA: one cuBLASLt call
// (kernels/cuda/matmul.h), bf16/f16 on tensor cores with float32 accumulation, float32 in
// float32 unless set_matmul_allow_tf32(true).
//
// matmul_bias: the product with a bias (and optionally a GELU) applied in the same pass, the
// forward of torch's linear / addmm_activation. On CUDA the bias and the GELU are cuBLASLt
// epilogues of the one GEMM; on the CPU (the reference) bit for bit as matmul, add and gelu
// give them (float32's bias in the GEMM's epilogue, which rounds as add's pass does).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/matmul_epilogue.h"

namespace dtr {

// a [M, K] times b [K, N]; ValueError naming both shapes if they do not chain.
Tensor matmul(const Tensor& a, const Tensor& b);

// a [B, M, K] times b [B, K, N], batch by batch; ValueError naming both shapes otherwise.
Tensor bmm(const Tensor& a, const Tensor& b);

// Overwrites out with a b. out must be contiguous, of the result's shape, a's dtype and
// device, and share no storage with a or b (ValueError/TypeError otherwise).
const Tensor& matmul_out(const Tensor& out, const Tensor& a, const Tensor& b);
const Tensor& bmm_out(const Tensor& out, const Tensor& a, const Tensor& b);

// acc [M, N] += a [M, K] b [K, N] (operands as matmul takes them), with acc the product's
// accumulator: float32 for float32, bfloat16 and float16 operands, float64 for float64;
// contiguous, on the operands' device (ValueError/TypeError otherwise). For a product summed
// in K blocks across calls (a weight gradient over row chunks): on the CPU acc is the GEMM's
// C with beta 1, so calls over consecutive K ranges of multiples of matmul_k_block(dtype)
// elements, from acc = 0, leave acc with the bits of one product's accumulator over their
// union, and acc.to(dtype) is matmul's result. float64 (Eigen's) and CUDA (the product, then
// an add) make no such promise.
void matmul_accumulate(const Tensor& acc, const Tensor& a, const Tensor& b);

// The K block that fixes the CPU GEMM's summation order for operands of `dtype`
// (kernels/cpu/gemm.h): what matmul_accumulate's K ranges are multiples of.
int64_t matmul_k_block(DType dtype);

// a [*, M, K] (leading dims folded into M) times b [K, N], plus bias [N] on every row, then
// the epilogue: [*, M, N], contiguous. a and b as matmul takes them; bias 1-D of b's columns,
// of the operands' dtype and device (ValueError/TypeError naming the three otherwise).
// bfloat16/float16: on the CPU each step rounds as matmul, add and gelu do; on CUDA the
// float32 accumulator gets the bias (and GELU) before its one rounding.
Tensor matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias,
                   MatmulEpilogue epilogue = MatmulEpilogue::kBias);

// The GELU epilogue for training: out = gelu(pre, kTanh) and pre = a b + bias, the input
// gelu_backward(grad, pre, GeluApproximation::kTanh) needs, written by the same pass
// (cuBLASLt's GELU_AUX_BIAS) instead of recomputing the product in backward. pre may be a
// view with padded rows (cuBLASLt wants its row stride a multiple of 8).
struct MatmulBiasGelu {
  Tensor out;
  Tensor pre;
};
MatmulBiasGelu matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias);

// Whether CUDA float32 products may use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32;
// default false). Process-wide.
void set_matmul_allow_tf32(bool allow);
bool matmul_allow_tf32();

}  // namespace dtr
