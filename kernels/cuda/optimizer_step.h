// CUDA kernels of the fused optimizer updates (kernels/optimizer_step.h): one pass over
// contiguous param, grad and state per parameter, with the CPU kernels' formulas and
// arithmetic in the state type (float for bfloat16 and float32 parameters, double for
// float64), so each element's update is the same sequence of operations as on the CPU.
// Queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/adam_scalars.h"
#include "kernels/dtype.h"

namespace dtr::cuda {

struct SgdScalars {
  double lr, weight_decay, momentum, keep;  // keep: 1 - dampening
  bool nesterov, first_step;
};

// momentum_buffer: nullptr without momentum.
void sgd_step(void* param, void* momentum_buffer, const void* grad, int64_t n, const SgdScalars& s, DType dtype,
              int device, cudaStream_t stream);
// max_exp_avg_sq: nullptr unless AMSGrad.
void adam_step(void* param, void* exp_avg, void* exp_avg_sq, void* max_exp_avg_sq, const void* grad, int64_t n,
               const AdamScalars<>& s, DType dtype, int device, cudaStream_t stream);

}  // namespace dtr::cuda
