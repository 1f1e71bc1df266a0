#include "kernels/cuda/relu_mask.h"

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"

namespace dtr::cuda {
namespace {

using internal::blocks_for;
using internal::kThreads;

static_assert(kThreads % 32 == 0, "a warp's 32 lanes build one word");

// At most this many blocks: a grid-stride loop (1024 x 256 threads fill an H100's 132 SMs
// about twice), so large tensors take several passes, which the [gpu] test exercises.
constexpr int kMaxMaskBlocks = 1024;

int mask_blocks(int64_t n) { return blocks_for(n) < kMaxMaskBlocks ? blocks_for(n) : kMaxMaskBlocks; }

// Each warp takes 32 consecutive elements at a time and lane 0 stores their ballot: the
// grid's stride is a multiple of 32, so a warp's lanes stay in step and leave the loop
// together (the ballot needs all 32).
template <class T>
__global__ void relu_mask_kernel(uint32_t* words, const T* y, int64_t n) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i - lane < n; i += int64_t{gridDim.x} * blockDim.x) {
    const bool passes = i < n && !(convert<opmath_t<T>>(y[i]) <= opmath_t<T>(0));
    const uint32_t bits = __ballot_sync(0xffffffffU, passes);
    if (lane == 0) words[i / 32] = bits;
  }
}

template <class T>
__global__ void apply_relu_mask_kernel(T* grad, const uint32_t* words, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    if (((words[i / 32] >> (i % 32)) & 1U) == 0) grad[i] = T(0);
  }
}

}  // namespace

void relu_mask(uint32_t* words, const void* y, int64_t n, DType dtype, int device, cudaStream_t stream) {
  if (n == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_floating(dtype, "cuda relu_mask", [&]<class T>(TypeTag<T>) {
    relu_mask_kernel<T><<<mask_blocks(n), kThreads, 0, stream>>>(words, static_cast<const T*>(y), n);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void apply_relu_mask(void* grad, const uint32_t* words, int64_t n, DType dtype, int device, cudaStream_t stream) {
  if (n == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_floating(dtype, "cuda apply_relu_mask_", [&]<class T>(TypeTag<T>) {
    apply_relu_mask_kernel<T><<<mask_blocks(n), kThreads, 0, stream>>>(static_cast<T*>(grad), words, n);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
