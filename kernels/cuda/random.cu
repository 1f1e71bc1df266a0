#include "kernels/cuda/random.h"

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "kernels/philox.h"

namespace dtr::cuda {
namespace {

using internal::blocks_for;
using internal::kThreads;

// The draws, as the CPU's (kernels/cpu/random.cc) from philox.h's helpers: fused
// multiply-adds by philox_affine, so nvcc's contraction changes nothing.
struct UniformDraw {
  double lo, scale;
  __device__ double operator()(uint64_t seed, uint64_t g) const {
    return philox_affine(philox_uniform(seed, g), scale, lo);
  }
};

struct NormalDraw {
  double mean, std;
  __device__ double operator()(uint64_t seed, uint64_t g) const {
    return philox_affine(philox_normal(seed, g), std, mean);
  }
};

struct BernoulliDraw {
  double p;
  __device__ double operator()(uint64_t seed, uint64_t g) const { return philox_bernoulli(seed, g, p) ? 1.0 : 0.0; }
};

template <class T, class Draw>
__global__ void draw_kernel(MapOperand t, MapShape shape, GlobalIndex global, uint64_t seed, Draw draw) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < shape.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, local = 0, g = global.base;
    for (int d = shape.ndim - 1; d >= 0; --d) {
      const int64_t c = rest % shape.sizes[d];
      rest /= shape.sizes[d];
      local += c * t.strides[d];
      g += c * global.strides[d];
    }
    static_cast<T*>(t.data)[local] = convert<T>(draw(seed, static_cast<uint64_t>(g)));
  }
}

template <class Dispatch, class Draw>
void launch(Dispatch dispatch, const MapOperand& t, const MapShape& shape, const GlobalIndex& global, uint64_t seed,
            const Draw& draw, DType dtype, const char* op, int device, cudaStream_t stream) {
  if (shape.numel == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch(dtype, op, [&]<class T>(TypeTag<T>) {
    draw_kernel<T><<<blocks_for(shape.numel), kThreads, 0, stream>>>(t, shape, global, seed, draw);
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

// dispatch_floating and dispatch_all as callables.
struct Floating {
  template <class F>
  void operator()(DType d, const char* op, F&& f) const {
    dispatch_floating(d, op, f);
  }
};
struct All {
  template <class F>
  void operator()(DType d, const char* op, F&& f) const {
    dispatch_all(d, op, f);
  }
};

}  // namespace

void uniform(const MapOperand& t, const MapShape& shape, const GlobalIndex& global, double lo, double scale,
             uint64_t seed, DType dtype, int device, cudaStream_t stream) {
  launch(Floating{}, t, shape, global, seed, UniformDraw{lo, scale}, dtype, "cuda uniform_", device, stream);
}

void normal(const MapOperand& t, const MapShape& shape, const GlobalIndex& global, double mean, double std,
            uint64_t seed, DType dtype, int device, cudaStream_t stream) {
  launch(Floating{}, t, shape, global, seed, NormalDraw{mean, std}, dtype, "cuda normal_", device, stream);
}

void bernoulli(const MapOperand& t, const MapShape& shape, const GlobalIndex& global, double p, uint64_t seed,
               DType dtype, int device, cudaStream_t stream) {
  launch(All{}, t, shape, global, seed, BernoulliDraw{p}, dtype, "cuda bernoulli", device, stream);
}

}  // namespace dtr::cuda
