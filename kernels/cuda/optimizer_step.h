// CUDA kernels of the fused optimizer updates (kernels/optimizer_step.h), multi-tensor: one
// launch updates up to kMaxListTensors parameters of one dtype, each block taking one
// chunk of kListChunk elements of one of them (torch's fused/foreach multi_tensor_apply),
// so a step over a model's parameters costs a few launches, not one per parameter.
// Each element's update is the CPU kernels' sequence of operations in the state type
// (float for bfloat16 and float32 parameters, double for float64). Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "kernels/adam_scalars.h"

namespace dtr::cuda {

inline constexpr int kMaxListTensors = 24;
inline constexpr int kMaxListBlocks = 256;
inline constexpr int64_t kListChunk = 65536;

// One parameter's contiguous device buffers: state[k] is nullptr where the step does not
// use it (SGD: momentum_buffer in state[0], read only with momentum; Adam: exp_avg,
// exp_avg_sq, max_exp_avg_sq).
struct StepPointers {
  void* param;
  const void* grad;
  void* state[3];
  int64_t n;
};

struct SgdScalars {
  double lr, weight_decay, momentum, keep;  // keep: 1 - dampening
  bool nesterov, first_step;
};

// Every parameter of `params` has dtype `dtype` and lives on `device`.
void sgd_step(std::span<const StepPointers> params, const SgdScalars& s, DType dtype, int device, cudaStream_t stream);
void adam_step(std::span<const StepPointers> params, const AdamScalars<>& s, DType dtype, int device,
               cudaStream_t stream);

}  // namespace dtr::cuda
