// Matrix products on CUDA through cuBLASLt: the CUDA half of kernels/matmul.h.
//
// bmm writes out [B, M, N] (contiguous, row-major) = a [B, M, K] times b [B, K, N], each
// operand given by its strides, one of its row and column strides being 1 (a row-major
// view, or a transposed one: x.t()), as one strided-batched cuBLASLt call on `stream`.
// float32 multiplies in float32 (TF32 tensor cores with allow_tf32), bfloat16 and float16 on
// tensor cores with float32 accumulation, float64 in float64. The algorithm cuBLASLt's
// heuristic picks is chosen once per (device, dtype, shapes, strides, alignment, options)
// and cached with its descriptors; `workspace` is scratch device memory of
// kMatmulWorkspaceBytes that the algorithm may use (the caller's, from the caching
// allocator). cuBLASLt failures throw CudaError naming the call, the device and
// cuBLASLt's status string; a problem no algorithm serves is a NotImplementedError.
//
// matmul_bias is one product with cuBLASLt's bias (and GELU) epilogue: cuBLASLt computes the
// column-major out^T = b^T a^T, so our per-column bias [n] is its per-row bias of D (its
// "rows of D" are our n), and the GELU's input it saves (the aux matrix) is our [m, n] with
// rows pre_ld apart. Its GELU is the tanh approximation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/cuda/stream.h"
#include "core/dtype.h"
#include "kernels/matmul_epilogue.h"

namespace dtr::cuda {

inline constexpr size_t kMatmulWorkspaceBytes = size_t{32} << 20;

// Element (r, c) of matrix i is at data + i * batch_stride + r * row_stride + c * col_stride
// (in elements); row_stride == 1 or col_stride == 1.
struct MatrixOperand {
  const void* data = nullptr;
  int64_t row_stride = 0, col_stride = 0, batch_stride = 0;
};

struct MatmulOptions {
  bool allow_tf32 = false;  // float32 on TF32 tensor cores (10-bit mantissa products)
};

void bmm(void* out, const MatrixOperand& a, const MatrixOperand& b, int64_t batch, int64_t m, int64_t n, int64_t k,
         DType dtype, MatmulOptions options, void* workspace, size_t workspace_bytes, int device, cudaStream_t stream);

// out [m, n] (contiguous, row-major) = epilogue(a [m, k] b [k, n] + bias [n]), applied to the
// float32 (float64) accumulator before its one rounding, one cuBLASLt call on `stream`; bias
// contiguous, of `dtype`; pre (kBiasGeluTanh only, else null), when given, receives a b + bias
// (GELU_AUX_BIAS): [m, n] of `dtype` with rows pre_ld apart, pre_ld a multiple of 8 and at
// least n. m, n and k positive. The plan is cached as bmm's, keyed on the epilogue, whether
// pre is written and the bias's and pre's alignments too. Returns false, having queued
// nothing, where cuBLASLt cannot serve the epilogue with these operands (its heuristic finds
// no algorithm or rejects the combination: a float64 GELU, a misaligned bias, say): the
// caller then composes the product and passes.
bool matmul_bias(void* out, void* pre, const MatrixOperand& a, const MatrixOperand& b, const void* bias, int64_t m,
                 int64_t n, int64_t k, int64_t pre_ld, DType dtype, MatmulEpilogue epilogue, MatmulOptions options,
                 void* workspace, size_t workspace_bytes, int device, cudaStream_t stream);

// For benchmarks (tools/bench/gpu_bench): bmm's product run with each of up to
// `candidates` algorithms cuBLASLt's heuristic ranks for it (the first is the one bmm
// uses), `iterations` times each after a warm-up, on `stream` (synchronised): the mean
// milliseconds per product of each, in the heuristic's order.
std::vector<float> time_algorithms(void* out, const MatrixOperand& a, const MatrixOperand& b, int64_t batch, int64_t m,
                                   int64_t n, int64_t k, DType dtype, MatmulOptions options, void* workspace,
                                   size_t workspace_bytes, const Stream& stream, int candidates, int iterations);

}  // namespace dtr::cuda
