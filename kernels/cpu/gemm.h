// The CPU GEMM under matmul, bmm and linear (float32, and bfloat16 with float32 accumulation):
//
//   C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b] + bias,   b = 0 .. batch-1
//
// with every layout the forward and backward of those ops produce, read in place: each
// operand row-major or transposed (unit stride in either dim) with any leading dimension and
// any batch stride (0 shares one matrix across the batch); C row-major with any leading
// dimension. The structure is BLIS's: B packed in KC x NC blocks and A in MC x KC blocks,
// into panels a register-blocked microkernel streams (per ISA, kernels/cpu/internal/gemm_*.cc,
// picked at run time by cpu_isa.h), threads through parallel_for over batch x N blocks x M
// ranges. Edges use masked loads and stores, not scalar tails.
//
// Summation order, the invariant layout-invariant training relies on: C[i][j] is the sum over
// fixed K blocks of kGemmKc (bfloat16 on AMX: kGemmKcBf16) in order, each block's products
// accumulated in k order (bfloat16: in pairs, or the tile unit's fixed order on AMX) from
// zero, then scaled by alpha and added to C (the first block: to beta * C; beta = 0 does not
// read C); the bias goes on after the last block. Nothing else enters: the element's position
// in C, how M and N are split into blocks and threads, and the thread count never change its
// bits. Different ISA paths round differently.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/cpu_isa.h"

namespace dtr::cpu {

// K block lengths that fix the summation order (above).
inline constexpr int64_t kGemmKc = 256;
inline constexpr int64_t kGemmKcBf16 = 512;

// One operand: element (r, c) of batch entry i is data[i * batch_stride + r * row_stride +
// c * col_stride], with row_stride == 1 or col_stride == 1 (a dim of extent <= 1 may take
// either). C must have col_stride == 1.
template <class T>
struct GemmMatrix {
  T* data = nullptr;
  int64_t row_stride = 0;
  int64_t col_stride = 1;
  int64_t batch_stride = 0;
};

// The scalars and epilogue of one call; isa picks the microkernels: the process's path
// unless a caller (a test, a benchmark) names another no higher than detected_cpu_isa().
struct GemmOptions {
  float alpha = 1.0f;
  float beta = 0.0f;
  const float* bias = nullptr;  // [N], unit stride, added to every row of C; or none
  CpuIsa isa = cpu_isa();
};

// C[b] [m, n] (float32) for b < batch from A[b] [m, k] and B[b] [k, n]; k = 0 gives
// beta * C + bias. Threads: num_threads(). C must not overlap A or B.
void gemm(int64_t batch, int64_t m, int64_t n, int64_t k, GemmMatrix<const float> a, GemmMatrix<const float> b,
          GemmMatrix<float> c, const GemmOptions& options);
void gemm(int64_t batch, int64_t m, int64_t n, int64_t k, GemmMatrix<const BFloat16> a, GemmMatrix<const BFloat16> b,
          GemmMatrix<float> c, const GemmOptions& options);

}  // namespace dtr::cpu
