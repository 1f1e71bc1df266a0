// Reductions across the threads of a block: each warp folds with shuffles, then warp 0
// folds the warps' results from shared memory. Every thread of the block must call it (it
// synchronises) and gets the block's result.
#pragma once

namespace dtr::cuda::internal {

// f(a, b) folds two partial results; `none` is the identity.
template <int kBlock, class T, class F>
__device__ inline T block_reduce(T v, T none, F f) {
  static_assert(kBlock % 32 == 0 && kBlock <= 1024);
  __shared__ T partial[kBlock / 32];
  __shared__ T result;
  for (int offset = 16; offset > 0; offset /= 2) v = f(v, __shfl_down_sync(0xffffffffu, v, offset));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kBlock / 32 ? partial[lane] : none;
    for (int offset = 16; offset > 0; offset /= 2) v = f(v, __shfl_down_sync(0xffffffffu, v, offset));
    if (lane == 0) result = v;
  }
  __syncthreads();
  const T out = result;
  __syncthreads();  // result and partial are rewritten by the next call
  return out;
}

template <int kBlock, class T>
__device__ inline T block_sum(T v) {
  return block_reduce<kBlock>(v, T(0), [](T a, T b) { return a + b; });
}

}  // namespace dtr::cuda::internal
