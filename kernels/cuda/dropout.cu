#include "kernels/cuda/dropout.h"

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/cuda/map_index.cuh"

namespace dtr::cuda {
namespace {

using internal::blocks_for;
using internal::kThreads;

template <class T>
__global__ void masked_scale_kernel(MapOperand out, MapOperand x, MapOperand mask, MapShape shape, opmath_t<T> scale) {
  using M = opmath_t<T>;
  const MapOperand* const operands[] = {&out, &x, &mask};
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < shape.numel;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    internal::map_offsets(shape, operands, i, off);
    const bool keep = static_cast<const bool*>(mask.data)[off[2]];
    const M v = convert<M>(static_cast<const T*>(x.data)[off[1]]);
    static_cast<T*>(out.data)[off[0]] = convert<T>(keep ? v * scale : M(0));
  }
}

}  // namespace

void masked_scale(const MapOperand& out, const MapOperand& x, const MapOperand& mask, const MapShape& shape,
                  double scale, DType dtype, int device, cudaStream_t stream) {
  if (shape.numel == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_floating(dtype, "cuda dropout", [&]<class T>(TypeTag<T>) {
    masked_scale_kernel<T>
        <<<blocks_for(shape.numel), kThreads, 0, stream>>>(out, x, mask, shape, static_cast<opmath_t<T>>(scale));
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
