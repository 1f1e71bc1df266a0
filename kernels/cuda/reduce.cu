#include "kernels/cuda/reduce.h"

#include <limits>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/cuda/map_index.cuh"

namespace dtr::cuda {
namespace {

using internal::kMaxBlocks;
using internal::kThreads;
using internal::map_offsets;

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>, float,
                                 std::conditional_t<std::is_floating_point_v<T>, double, int64_t>>;

template <ReduceKind Op, class T>
using out_t = std::conditional_t<(Op == ReduceKind::kSum) && !std::is_floating_point_v<acc_t<T>>, int64_t, T>;

template <ReduceKind Op, class A>
__device__ inline A identity() {
  if constexpr (Op == ReduceKind::kMax) {
    return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                : std::numeric_limits<A>::lowest();
  } else if constexpr (Op == ReduceKind::kMin) {
    return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
  } else {
    return A(0);
  }
}

// Folds a partial result (or a loaded value, already squared for kSumOfSquares) into acc.
template <ReduceKind Op, class A>
__device__ inline A combine(A acc, A v) {
  if constexpr (Op == ReduceKind::kMax) {
    return v != v || v > acc ? v : acc;  // once NaN, acc stays NaN (NaN > x is false)
  } else if constexpr (Op == ReduceKind::kMin) {
    return v != v || v < acc ? v : acc;
  } else {
    return acc + v;
  }
}

template <ReduceKind Op, class A>
__device__ inline A shuffle_reduce(A acc) {
  for (int offset = 16; offset > 0; offset /= 2) acc = combine<Op>(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  return acc;
}

// G threads per output element: 32 (a warp) or kThreads (a block).
template <ReduceKind Op, class T, int G>
__global__ void reduce_kernel(out_t<Op, T>* out, ReduceLayout l) {
  using A = acc_t<T>;
  constexpr int kGroups = kThreads / G;
  __shared__ A partial[kThreads / 32];
  const int lane = static_cast<int>(threadIdx.x) % G, group = static_cast<int>(threadIdx.x) / G;
  const T* x = static_cast<const T*>(l.x_kept.data);
  const MapOperand* const kept[] = {&l.x_kept};
  const MapOperand* const reduced[] = {&l.x_reduced};
  // Uniform over each group (the whole block when G == kThreads): the syncs below are safe.
  for (int64_t o = blockIdx.x * int64_t{kGroups} + group; o - group < l.kept.numel; o += int64_t{gridDim.x} * kGroups) {
    A acc = identity<Op, A>();
    if (o < l.kept.numel) {
      int64_t base[1];
      map_offsets(l.kept, kept, o, base);
      for (int64_t r = lane; r < l.reduced.numel; r += G) {
        int64_t at[1];
        map_offsets(l.reduced, reduced, r, at);
        const A v = convert<A>(x[base[0] + at[0]]);
        acc = combine<Op>(acc, Op == ReduceKind::kSumOfSquares ? A(v * v) : v);
      }
    }
    acc = shuffle_reduce<Op>(acc);
    if constexpr (G == kThreads) {
      const int warp = static_cast<int>(threadIdx.x) / 32;
      if (threadIdx.x % 32 == 0) partial[warp] = acc;
      __syncthreads();
      if (warp == 0) {
        acc = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : identity<Op, A>();
        acc = shuffle_reduce<Op>(acc);
      }
      __syncthreads();  // partial is rewritten by the next output
    }
    if (lane == 0 && o < l.kept.numel) {
      if constexpr (Op == ReduceKind::kMean) acc = acc / A(l.reduced.numel);
      out[o] = convert<out_t<Op, T>>(acc);
    }
  }
}

// Whether (a, ia) comes before (b, ib) as argmax's answer: NaN first, then the larger value,
// then the smaller index.
template <class A>
__device__ inline bool better(A a, int64_t ia, A b, int64_t ib) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan != b_nan) return a_nan;
  if (!a_nan && a != b) return a > b;
  return ia < ib;
}

template <class T>
__global__ void argmax_kernel(int64_t* out, ReduceLayout l) {
  using A = acc_t<T>;
  constexpr int kWarps = kThreads / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const T* x = static_cast<const T*>(l.x_kept.data);
  const MapOperand* const kept[] = {&l.x_kept};
  const MapOperand* const reduced[] = {&l.x_reduced};
  for (int64_t o = blockIdx.x * int64_t{kWarps} + warp; o - warp < l.kept.numel; o += int64_t{gridDim.x} * kWarps) {
    A best = A(0);
    int64_t index = -1;  // none seen yet
    if (o < l.kept.numel) {
      int64_t base[1];
      map_offsets(l.kept, kept, o, base);
      for (int64_t r = lane; r < l.reduced.numel; r += 32) {
        int64_t at[1];
        map_offsets(l.reduced, reduced, r, at);
        const A v = convert<A>(x[base[0] + at[0]]);
        if (index < 0 || better(v, r, best, index)) {
          best = v;
          index = r;
        }
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const A other = __shfl_down_sync(0xffffffffu, best, offset);
      const int64_t other_index = __shfl_down_sync(0xffffffffu, index, offset);
      if (other_index >= 0 && (index < 0 || better(other, other_index, best, index))) {
        best = other;
        index = other_index;
      }
    }
    if (lane == 0 && o < l.kept.numel) out[o] = index;
  }
}

template <ReduceKind Op, class T>
void launch(void* out, const ReduceLayout& layout, cudaStream_t stream) {
  auto* o = static_cast<out_t<Op, T>*>(out);
  if (layout.reduced.numel >= 4096 || layout.kept.numel < 1024) {  // few outputs, or long ones: a block each
    const auto blocks = static_cast<int>(std::min(layout.kept.numel, kMaxBlocks));
    reduce_kernel<Op, T, kThreads><<<blocks, kThreads, 0, stream>>>(o, layout);
  } else {
    constexpr int64_t kGroups = kThreads / 32;
    const auto blocks = static_cast<int>(std::min((layout.kept.numel + kGroups - 1) / kGroups, kMaxBlocks));
    reduce_kernel<Op, T, 32><<<blocks, kThreads, 0, stream>>>(o, layout);
  }
}

template <ReduceKind Op>
void launch_op(void* out, const ReduceLayout& layout, DType dtype, cudaStream_t stream) {
  auto go = [&]<class T>(TypeTag<T>) { launch<Op, T>(out, layout, stream); };
  if constexpr (Op == ReduceKind::kMean || Op == ReduceKind::kSumOfSquares) {
    dispatch_floating(dtype, "cuda reduce", go);
  } else {
    dispatch_all(dtype, "cuda reduce", go);
  }
}

}  // namespace

void reduce(void* out, const ReduceLayout& layout, DType dtype, ReduceKind op, int device, cudaStream_t stream) {
  if (layout.kept.numel == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  switch (op) {
    case ReduceKind::kSum: launch_op<ReduceKind::kSum>(out, layout, dtype, stream); break;
    case ReduceKind::kMean: launch_op<ReduceKind::kMean>(out, layout, dtype, stream); break;
    case ReduceKind::kMax: launch_op<ReduceKind::kMax>(out, layout, dtype, stream); break;
    case ReduceKind::kMin: launch_op<ReduceKind::kMin>(out, layout, dtype, stream); break;
    case ReduceKind::kSumOfSquares: launch_op<ReduceKind::kSumOfSquares>(out, layout, dtype, stream); break;
  }
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void argmax(int64_t* out, const ReduceLayout& layout, DType dtype, int device, cudaStream_t stream) {
  if (layout.kept.numel == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  constexpr int64_t kWarps = kThreads / 32;
  const auto blocks = static_cast<int>(std::min((layout.kept.numel + kWarps - 1) / kWarps, kMaxBlocks));
  dispatch_numeric(dtype, "cuda argmax",
                   [&]<class T>(TypeTag<T>) { argmax_kernel<T><<<blocks, kThreads, 0, stream>>>(out, layout); });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
