// CUDA elementwise kernels: the CUDA half of kernels/elementwise.h (what kernels/cpu/
// elementwise.h computes on the CPU, with the same formulas).
//
// One launcher, map(), writes out[i] = op(inputs[i]..., scalars) over `shape`. Every
// operand is a pointer and its strides in elements over that shape (0 where it broadcasts).
// When every operand is contiguous and none broadcasts, each thread loads and stores 16
// bytes of each operand at a time (where every pointer is aligned to it), else it computes
// each operand's offset from its linear index. bfloat16/float16 load to float, compute in
// float and round once on store; every other dtype computes in its own type (as opmath_t).
// `dtype` is the value operands' (the input of a comparison, not its bool output; where's
// and masked_fill's condition and mask are bool). Queued on `stream`; throws
// NotImplementedError for a dtype the op does not support.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/map_layout.h"
#include "core/dtype.h"

namespace dtr::cuda {

// The ops, by arity. s0 and s1 are MapScalars'.
enum class MapOp : uint8_t {
  // out = f(a)
  kNeg,
  kAbs,
  kRelu,
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kTanh,
  kSigmoid,
  kGelu,
  kGeluTanh,
  kSilu,
  kLogicalNot,  // bool out
  kClamp,       // min(max(a, s0), s1): absent bounds are passed as -inf / +inf (lowest / max)
  kAddScalar,
  kSubScalar,
  kMulScalar,
  kDivScalar,
  kRsubScalar,
  kPowScalar,  // a op s0
  kEqScalar,
  kNeScalar,
  kLtScalar,
  kLeScalar,
  kGtScalar,
  kGeScalar,  // bool out: a op s0
  // out = f(a, b)
  kAdd,  // a + s0 * b
  kSub,
  kMul,
  kDiv,
  kMaximum,
  kMinimum,
  kReluBackward,
  kGeluBackward,
  kGeluTanhBackward,
  kSiluBackward,  // (grad, x)
  kSigmoidBackward,
  kTanhBackward,  // (grad, y)
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,          // bool out
  kMaskedFill,  // (a, mask): mask ? s0 : a
  // out = f(a, b, c)
  kWhere,  // (condition, a, b): condition ? a : b
};

struct MapScalars {
  double s0 = 0, s1 = 0;
};

// Inputs of the op (1, 2 or 3, by its arity) in `inputs[0..]`.
void map(const MapOperand& out, const MapOperand* inputs, const MapShape& shape, DType dtype, MapOp op,
         MapScalars scalars, int device, cudaStream_t stream);

}  // namespace dtr::cuda
