// CPU kernels of the fused optimizer updates: one loop over contiguous param, grad and
// state, split across threads (each element is independent, so the bits never depend on
// the thread count). Arithmetic is in the state dtype (acc_t of the parameter's type).
// The caller (kernels/optimizer_step.cc) has checked dtypes, shapes, layout and options.
#pragma once

#include <cstdint>

#include "kernels/optimizer_step.h"

namespace dtr::cpu {

// How Adam applies weight decay: L2 adds wd * param to the gradient (Adam); decoupled
// scales param by 1 - lr * wd before the update (AdamW).
enum class WeightDecay { kL2, kDecoupled };

// param and the state tensors are updated in place (the outputs, first); grad is read.
void sgd_step(const Tensor& param, const Tensor& momentum_buffer, const Tensor& grad, int64_t step,
              const SgdOptions& options);
// max_exp_avg_sq: null, or AMSGrad's running maximum of exp_avg_sq.
void adam_step(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* max_exp_avg_sq,
               const Tensor& grad, int64_t step, const AdamOptions& options, WeightDecay decay);

}  // namespace dtr::cpu
