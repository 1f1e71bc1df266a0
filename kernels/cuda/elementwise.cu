#include "kernels/cuda/elementwise.h"

#include <limits>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/cuda/map_index.cuh"
#include "kernels/cuda/internal/device_math.cuh"

namespace dtr::cuda {
namespace {

using internal::abs_of;
using internal::blocks_for;
using internal::erf_of;
using internal::exp_of;
using internal::kThreads;
using internal::log_of;
using internal::map_offsets;
using internal::pow_of;
using internal::sqrt_of;
using internal::tanh_of;

constexpr int arity(MapOp op) {
  if (op <= MapOp::kGeScalar) return 1;
  if (op <= MapOp::kMaskedFill) return 2;
  return 3;
}

constexpr bool bool_out(MapOp op) {
  return op == MapOp::kLogicalNot || (op >= MapOp::kEqScalar && op <= MapOp::kGeScalar) ||
         (op >= MapOp::kEq && op <= MapOp::kGe);
}

// Whether input slot k of `op` is a bool condition or mask (the others hold the dtype's values).
constexpr bool bool_input(MapOp op, int k) {
  return (op == MapOp::kMaskedFill && k == 1) || (op == MapOp::kWhere && k == 0);
}

// The dtypes each op takes, as kernels/cpu/elementwise.h's.
enum class Dtypes : uint8_t { kFloating, kNumeric, kAll };
constexpr Dtypes dtypes_of(MapOp op) {
  switch (op) {
    case MapOp::kNeg:
    case MapOp::kAbs:
    case MapOp::kRelu:
    case MapOp::kClamp:
    case MapOp::kAddScalar:
    case MapOp::kSubScalar:
    case MapOp::kMulScalar:
    case MapOp::kRsubScalar:
    case MapOp::kAdd:
    case MapOp::kSub:
    case MapOp::kMul:
    case MapOp::kMaximum:
    case MapOp::kMinimum: return Dtypes::kNumeric;
    case MapOp::kLogicalNot:
    case MapOp::kEqScalar:
    case MapOp::kNeScalar:
    case MapOp::kLtScalar:
    case MapOp::kLeScalar:
    case MapOp::kGtScalar:
    case MapOp::kGeScalar:
    case MapOp::kEq:
    case MapOp::kNe:
    case MapOp::kLt:
    case MapOp::kLe:
    case MapOp::kGt:
    case MapOp::kGe:
    case MapOp::kMaskedFill:
    case MapOp::kWhere: return Dtypes::kAll;
    default: return Dtypes::kFloating;
  }
}

template <class M>
__device__ inline bool is_nan(M v) {
  return v != v;  // false for every integer
}

// 1 / (1 + exp(-x)) with the exp of a value <= 0 only (as the CPU's sigmoid_of).
template <class M>
__device__ inline M sigmoid_of(M x) {
  const M e = exp_of(-abs_of(x));
  return (x >= M(0) ? M(1) : e) / (M(1) + e);
}

// gelu's constants: 1/sqrt(2), sqrt(2/pi), 1/sqrt(2 pi), the cubic coefficient.
constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kGeluCubic = 0.044715;

// The op on values already in M (bool inputs as 0 or 1).
template <MapOp Op, class M>
__device__ inline auto compute(M a, M b, M c, M s0, M s1) {
  if constexpr (Op == MapOp::kNeg)
    return M(-a);
  else if constexpr (Op == MapOp::kAbs)
    return a < M(0) ? M(-a) : a;
  else if constexpr (Op == MapOp::kRelu)
    return a < M(0) ? M(0) : a;
  else if constexpr (Op == MapOp::kExp)
    return exp_of(a);
  else if constexpr (Op == MapOp::kLog)
    return log_of(a);
  else if constexpr (Op == MapOp::kSqrt)
    return sqrt_of(a);
  else if constexpr (Op == MapOp::kRsqrt)
    return M(1) / sqrt_of(a);
  else if constexpr (Op == MapOp::kTanh)
    return tanh_of(a);
  else if constexpr (Op == MapOp::kSigmoid)
    return sigmoid_of(a);
  else if constexpr (Op == MapOp::kGelu)
    return M(0.5) * a * (M(1) + erf_of(a * M(kSqrtHalf)));
  else if constexpr (Op == MapOp::kGeluTanh)
    return a * sigmoid_of(M(2 * kSqrt2OverPi) * (a + M(kGeluCubic) * a * a * a));
  else if constexpr (Op == MapOp::kSilu)
    return a * sigmoid_of(a);
  else if constexpr (Op == MapOp::kLogicalNot)
    return a == M(0);
  else if constexpr (Op == MapOp::kClamp) {
    const M r = a < s0 ? s0 : a;  // NaN compares false and passes, as on the CPU
    return r > s1 ? s1 : r;
  } else if constexpr (Op == MapOp::kAddScalar)
    return M(a + s0);
  else if constexpr (Op == MapOp::kSubScalar)
    return M(a - s0);
  else if constexpr (Op == MapOp::kMulScalar)
    return M(a * s0);
  else if constexpr (Op == MapOp::kDivScalar)
    return M(a / s0);
  else if constexpr (Op == MapOp::kRsubScalar)
    return M(s0 - a);
  else if constexpr (Op == MapOp::kPowScalar)
    return s0 == M(2) ? M(a * a) : pow_of(a, s0);
  else if constexpr (Op == MapOp::kEqScalar)
    return a == s0;
  else if constexpr (Op == MapOp::kNeScalar)
    return a != s0;
  else if constexpr (Op == MapOp::kLtScalar)
    return a < s0;
  else if constexpr (Op == MapOp::kLeScalar)
    return a <= s0;
  else if constexpr (Op == MapOp::kGtScalar)
    return a > s0;
  else if constexpr (Op == MapOp::kGeScalar)
    return a >= s0;
  else if constexpr (Op == MapOp::kAdd)
    return M(a + s0 * b);
  else if constexpr (Op == MapOp::kSub)
    return M(a - b);
  else if constexpr (Op == MapOp::kMul)
    return M(a * b);
  else if constexpr (Op == MapOp::kDiv)
    return M(a / b);
  else if constexpr (Op == MapOp::kMaximum)
    return is_nan(a) || a > b ? a : b;
  else if constexpr (Op == MapOp::kMinimum)
    return is_nan(a) || a < b ? a : b;
  else if constexpr (Op == MapOp::kReluBackward)
    return b <= M(0) ? M(0) : a;
  else if constexpr (Op == MapOp::kGeluBackward) {
    const M cdf = M(0.5) * (M(1) + erf_of(b * M(kSqrtHalf)));
    const M pdf = M(kInvSqrt2Pi) * exp_of(M(-0.5) * b * b);
    return a * (cdf + b * pdf);
  } else if constexpr (Op == MapOp::kGeluTanhBackward) {
    const M s = sigmoid_of(M(2 * kSqrt2OverPi) * (b + M(kGeluCubic) * b * b * b));
    const M du = M(kSqrt2OverPi) * (M(1) + M(3 * kGeluCubic) * b * b);
    return a * (s + M(2) * b * s * (M(1) - s) * du);
  } else if constexpr (Op == MapOp::kSiluBackward) {
    const M s = sigmoid_of(b);
    return a * s * (M(1) + b * (M(1) - s));
  } else if constexpr (Op == MapOp::kSigmoidBackward)
    return a * (M(1) - b) * b;
  else if constexpr (Op == MapOp::kTanhBackward)
    return a * (M(1) - b * b);
  else if constexpr (Op == MapOp::kEq)
    return a == b;
  else if constexpr (Op == MapOp::kNe)
    return a != b;
  else if constexpr (Op == MapOp::kLt)
    return a < b;
  else if constexpr (Op == MapOp::kLe)
    return a <= b;
  else if constexpr (Op == MapOp::kGt)
    return a > b;
  else if constexpr (Op == MapOp::kGe)
    return a >= b;
  else if constexpr (Op == MapOp::kMaskedFill)
    return b != M(0) ? s0 : a;
  else {
    static_assert(Op == MapOp::kWhere);
    return a != M(0) ? b : c;
  }
}

template <MapOp Op, class T, int K>
using input_t = std::conditional_t<bool_input(Op, K), bool, T>;
template <MapOp Op, class T>
using output_t = std::conditional_t<bool_out(Op), bool, T>;

// Input K of element at `offset`, in M (c unused below the op's arity: M(0)).
template <MapOp Op, class T, int K>
__device__ inline opmath_t<T> load(const MapOperand& in, int64_t offset) {
  using M = opmath_t<T>;
  if constexpr (K >= arity(Op)) {
    return M(0);
  } else {
    return convert<M>(static_cast<const input_t<Op, T, K>*>(in.data)[offset]);
  }
}

struct MapInputs {
  MapOperand v[3];
};

// Any layout: each operand's offset from the linear index (all equal when contiguous).
template <MapOp Op, class T>
__global__ void map_kernel(MapShape shape, MapOperand out, MapInputs in, opmath_t<T> s0, opmath_t<T> s1,
                           bool contiguous) {
  constexpr int N = arity(Op);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < shape.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[N + 1];
    if (contiguous) {
      for (int k = 0; k <= N; ++k) off[k] = i;
    } else {
      if constexpr (N == 1) {
        const MapOperand* const operands[] = {&out, &in.v[0]};
        map_offsets(shape, operands, i, off);
      } else if constexpr (N == 2) {
        const MapOperand* const operands[] = {&out, &in.v[0], &in.v[1]};
        map_offsets(shape, operands, i, off);
      } else {
        const MapOperand* const operands[] = {&out, &in.v[0], &in.v[1], &in.v[2]};
        map_offsets(shape, operands, i, off);
      }
    }
    const auto r = compute<Op>(load<Op, T, 0>(in.v[0], off[1]), load<Op, T, 1>(in.v[1], off[N > 1 ? 2 : 0]),
                               load<Op, T, 2>(in.v[2], off[N > 2 ? 3 : 0]), s0, s1);
    static_cast<output_t<Op, T>*>(out.data)[off[0]] = convert<output_t<Op, T>>(r);
  }
}

// V elements of T, loaded and stored as one 16-byte (or narrower, for bool outputs) access.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <class T>
inline constexpr int kVector = 16 / static_cast<int>(sizeof(T));

// Contiguous operands, none broadcast, none a bool input: V elements per access, then the tail.
template <MapOp Op, class T>
__global__ void map_vectorized(int64_t n, void* out, MapInputs in, opmath_t<T> s0, opmath_t<T> s1) {
  constexpr int V = kVector<T>;
  constexpr int N = arity(Op);
  using O = output_t<Op, T>;
  using M = opmath_t<T>;
  const int64_t packs = n / V, stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (int64_t p = first; p < packs; p += stride) {
    Pack<T, V> x[N];
    for (int k = 0; k < N; ++k) x[k] = static_cast<const Pack<T, V>*>(in.v[k].data)[p];
    Pack<O, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const M a = convert<M>(x[0].v[j]);
      const M b = N > 1 ? convert<M>(x[N > 1 ? 1 : 0].v[j]) : M(0);
      const M c = N > 2 ? convert<M>(x[N - 1].v[j]) : M(0);
      r.v[j] = convert<O>(compute<Op>(a, b, c, s0, s1));
    }
    static_cast<Pack<O, V>*>(out)[p] = r;
  }
  for (int64_t i = packs * V + first; i < n; i += stride) {
    const M a = load<Op, T, 0>(in.v[0], i), b = load<Op, T, 1>(in.v[1], i), c = load<Op, T, 2>(in.v[2], i);
    static_cast<O*>(out)[i] = convert<O>(compute<Op>(a, b, c, s0, s1));
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// A scalar in M: integers clamp to their range (absent clamp bounds come as +-inf); a
// comparison's scalar is first rounded to T (as the CPU's).
template <MapOp Op, class T>
opmath_t<T> scalar_in(double s) {
  using M = opmath_t<T>;
  if constexpr (Op >= MapOp::kEqScalar && Op <= MapOp::kGeScalar) s = static_cast<double>(convert<M>(convert<T>(s)));
  if constexpr (std::is_integral_v<M> && !std::is_same_v<M, bool>) {
    if (s <= static_cast<double>(std::numeric_limits<M>::lowest())) return std::numeric_limits<M>::lowest();
    if (s >= static_cast<double>(std::numeric_limits<M>::max())) return std::numeric_limits<M>::max();
  }
  return static_cast<M>(s);
}

template <MapOp Op, class T>
void launch(const MapOperand& out, const MapOperand* inputs, const MapShape& shape, MapScalars scalars,
            cudaStream_t stream) {
  constexpr int N = arity(Op);
  MapInputs in{};
  for (int k = 0; k < N; ++k) in.v[k] = inputs[k];
  const auto s0 = scalar_in<Op, T>(scalars.s0), s1 = scalar_in<Op, T>(scalars.s1);
  bool contiguous = contiguous_over(out, shape);
  bool vectorizable = contiguous && aligned(out.data, sizeof(output_t<Op, T>) * kVector<T>);
  for (int k = 0; k < N; ++k) {
    const bool c = contiguous_over(inputs[k], shape);
    contiguous = contiguous && c;
    vectorizable = vectorizable && c && !bool_input(Op, k) && aligned(inputs[k].data, 16);
  }
  if (vectorizable) {
    map_vectorized<Op, T>
        <<<blocks_for(shape.numel / kVector<T> + 1), kThreads, 0, stream>>>(shape.numel, out.data, in, s0, s1);
  } else {
    map_kernel<Op, T><<<blocks_for(shape.numel), kThreads, 0, stream>>>(shape, out, in, s0, s1, contiguous);
  }
}

template <MapOp Op>
void launch_op(const MapOperand& out, const MapOperand* inputs, const MapShape& shape, DType dtype, MapScalars scalars,
               cudaStream_t stream) {
  auto go = [&]<class T>(TypeTag<T>) { launch<Op, T>(out, inputs, shape, scalars, stream); };
  constexpr const char* kName = "cuda map";
  if constexpr (dtypes_of(Op) == Dtypes::kFloating) {
    dispatch_floating(dtype, kName, go);
  } else if constexpr (dtypes_of(Op) == Dtypes::kNumeric) {
    dispatch_numeric(dtype, kName, go);
  } else {
    dispatch_all(dtype, kName, go);
  }
}

}  // namespace

void map(const MapOperand& out, const MapOperand* inputs, const MapShape& shape, DType dtype, MapOp op,
         MapScalars scalars, int device, cudaStream_t stream) {
  if (shape.numel == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  switch (op) {
#define DTR_MAP_CASE(name) \
  case MapOp::name: launch_op<MapOp::name>(out, inputs, shape, dtype, scalars, stream); break;
    DTR_MAP_CASE(kNeg)
    DTR_MAP_CASE(kAbs)
    DTR_MAP_CASE(kRelu)
    DTR_MAP_CASE(kExp)
    DTR_MAP_CASE(kLog)
    DTR_MAP_CASE(kSqrt)
    DTR_MAP_CASE(kRsqrt)
    DTR_MAP_CASE(kTanh)
    DTR_MAP_CASE(kSigmoid)
    DTR_MAP_CASE(kGelu)
    DTR_MAP_CASE(kGeluTanh)
    DTR_MAP_CASE(kSilu)
    DTR_MAP_CASE(kLogicalNot)
    DTR_MAP_CASE(kClamp)
    DTR_MAP_CASE(kAddScalar)
    DTR_MAP_CASE(kSubScalar)
    DTR_MAP_CASE(kMulScalar)
    DTR_MAP_CASE(kDivScalar)
    DTR_MAP_CASE(kRsubScalar)
    DTR_MAP_CASE(kPowScalar)
    DTR_MAP_CASE(kEqScalar)
    DTR_MAP_CASE(kNeScalar)
    DTR_MAP_CASE(kLtScalar)
    DTR_MAP_CASE(kLeScalar)
    DTR_MAP_CASE(kGtScalar)
    DTR_MAP_CASE(kGeScalar)
    DTR_MAP_CASE(kAdd)
    DTR_MAP_CASE(kSub)
    DTR_MAP_CASE(kMul)
    DTR_MAP_CASE(kDiv)
    DTR_MAP_CASE(kMaximum)
    DTR_MAP_CASE(kMinimum)
    DTR_MAP_CASE(kReluBackward)
    DTR_MAP_CASE(kGeluBackward)
    DTR_MAP_CASE(kGeluTanhBackward)
    DTR_MAP_CASE(kSiluBackward)
    DTR_MAP_CASE(kSigmoidBackward)
    DTR_MAP_CASE(kTanhBackward)
    DTR_MAP_CASE(kEq)
    DTR_MAP_CASE(kNe)
    DTR_MAP_CASE(kLt)
    DTR_MAP_CASE(kLe)
    DTR_MAP_CASE(kGt)
    DTR_MAP_CASE(kGe)
    DTR_MAP_CASE(kMaskedFill)
    DTR_MAP_CASE(kWhere)
#undef DTR_MAP_CASE
  }
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
