// Fused optimizer updates: one pass over parameter, gradient and state per step, with
// torch.optim's formulas (SGD, Adam, AdamW as their documentation writes them).
//
// Invariants: param, grad and every state tensor are contiguous, on one device and of one
// shape; grad has param's dtype. Parameters are float32, float64 or bfloat16; the state
// and the arithmetic are in optimizer_state_dtype(param) (float32 for bfloat16), so a
// bfloat16 parameter is rounded once per step. `step` counts from 1 and is the step being
// taken (torch's t). The caller owns the state and the step counts; these only update
// tensors in place.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace dtr {

// torch.optim.SGD's hyperparameters. nesterov needs momentum > 0 and dampening == 0.
struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2: added to the gradient
  bool nesterov = false;
};

// torch.optim.Adam's hyperparameters (betas as beta1, beta2).
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2: added to the gradient
};

// torch.optim.AdamW's hyperparameters; its weight decay is decoupled and defaults to 1e-2.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: param *= 1 - lr * weight_decay
};

// The dtype of optimizer state (and arithmetic) for a parameter dtype: float32 for
// bfloat16 and float32 parameters, float64 for float64. Other dtypes raise TypeError.
DType optimizer_state_dtype(DType param_dtype);

// One SGD step. momentum_buffer is read and written when momentum != 0 (set to the
// decayed gradient at step 1 rather than accumulated: torch's "buffer is None") and may be
// undefined otherwise.
void sgd_step_(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, int64_t step, const SgdOptions& options);
// One Adam step: exp_avg and exp_avg_sq are the first and second moments (zeros before step 1),
// bias-corrected with `step`; weight_decay is L2 (added to the gradient). With
// max_exp_avg_sq (zeros before step 1, state dtype) the step is AMSGrad's: the buffer keeps
// the running maximum of exp_avg_sq and the update divides by its square root instead.
void adam_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, int64_t step,
                const AdamOptions& options, Tensor* max_exp_avg_sq = nullptr);
// One AdamW step: Adam with the weight decay applied to param directly.
void adamw_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, int64_t step,
                 const AdamWOptions& options, Tensor* max_exp_avg_sq = nullptr);

// One parameter's tensors in a multi-tensor step (handles: the step writes the storage of
// param and of its state). state holds SGD's momentum_buffer in [0] (undefined without
// momentum), or Adam's exp_avg, exp_avg_sq and, for AMSGrad, max_exp_avg_sq in [0], [1]
// and [2] ([2] undefined otherwise).
struct StepTensors {
  Tensor param;
  Tensor grad;
  std::array<Tensor, 3> state;
};

// The steps above for every parameter of `params`, all taking step `step` with the same
// options (torch's fused=True): on CUDA one multi-tensor launch per device, dtype and up to
// 24 parameters (kernels/cuda/optimizer_step.h), on the CPU one parallel loop per
// parameter. Each parameter ends exactly as its single-tensor step would leave it.
void sgd_step_(std::span<const StepTensors> params, int64_t step, const SgdOptions& options);
void adam_step_(std::span<const StepTensors> params, int64_t step, const AdamOptions& options);
void adamw_step_(std::span<const StepTensors> params, int64_t step, const AdamWOptions& options);

}  // namespace dtr
