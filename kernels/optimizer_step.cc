#include "kernels/optimizer_step.h"

#include <utility>

#include "kernels/adam_scalars.h"
#include "kernels/cpu/optimizer_step.h"
#include "kernels/cuda/optimizer_step.h"
#include "kernels/cuda/stream.h"
#include "kernels/trace.h"

namespace dtr {

namespace {

// The state dtype of a parameter dtype, or TypeError naming op.
DType state_dtype_for(std::string_view op, DType param_dtype) {
  switch (param_dtype) {
    case kFloat32:
    case kBFloat16: return kFloat32;
    case kFloat64: return kFloat64;
    default:
      throw TypeError(
          fmt::format("{}: {} parameters are not supported; parameters must be float32, float64 or "
                      "bfloat16",
                      op, param_dtype));
  }
}

// Checks param and grad, and each named state tensor against param; see the header's invariants.
void check_step_tensors(std::string_view op, const Tensor& param, const Tensor& grad,
                        std::initializer_list<std::pair<std::string_view, const Tensor*>> states) {
  DTR_CHECK(param.defined() && grad.defined(), ValueError, "{}: param ({}) and grad ({}) must be defined", op,
            describe(param), describe(grad));
  const DType state_dtype = state_dtype_for(op, param.dtype());
  DTR_CHECK(grad.dtype() == param.dtype(), TypeError, "{}: grad is {} but param is {}; grad needs param's dtype", op,
            describe(grad), describe(param));
  auto check_like_param = [&](std::string_view name, const Tensor& t) {
    DTR_CHECK(t.shape() == param.shape(), ValueError, "{}: {} is {} but param is {}; they need the same shape", op,
              name, describe(t), describe(param));
    DTR_CHECK(t.device() == param.device(), ValueError, "{}: {} is on {} but param is on {}; they need one device", op,
              name, t.device(), param.device());
    DTR_CHECK(t.is_contiguous(), ValueError,
              "{}: {} ({}, strides {}) is not contiguous; fused steps need contiguous "
              "tensors",
              op, name, describe(t), t.strides());
  };
  check_like_param("param", param);
  check_like_param("grad", grad);
  for (const auto& [name, state] : states) {
    DTR_CHECK(state->defined(), ValueError, "{}: {} must be defined (a {}{} tensor)", op, name, state_dtype,
              param.shape());
    DTR_CHECK(state->dtype() == state_dtype, TypeError, "{}: {} is {}; the state of a {} parameter is {}", op, name,
              describe(*state), param.dtype(), state_dtype);
    check_like_param(name, *state);
  }
}

void check_step_count(std::string_view op, int64_t step) {
  DTR_CHECK(step >= 1, ValueError, "{}: step {} is invalid; steps count from 1 (the step being taken)", op, step);
}

// Checks Adam's and AdamW's hyperparameters against torch.optim's rules.
void check_adam_options(std::string_view op, double lr, double beta1, double beta2, double eps, double weight_decay) {
  DTR_CHECK(lr >= 0.0, ValueError, "{}: invalid lr {}; it must be >= 0", op, lr);
  DTR_CHECK(eps >= 0.0, ValueError, "{}: invalid eps {}; it must be >= 0", op, eps);
  DTR_CHECK(beta1 >= 0.0 && beta1 < 1.0, ValueError, "{}: invalid beta1 {}; it must be in [0, 1)", op, beta1);
  DTR_CHECK(beta2 >= 0.0 && beta2 < 1.0, ValueError, "{}: invalid beta2 {}; it must be in [0, 1)", op, beta2);
  DTR_CHECK(weight_decay >= 0.0, ValueError, "{}: invalid weight_decay {}; it must be >= 0", op, weight_decay);
}

// Adam and AdamW, which differ only in how weight decay applies: checks, then the device switch.
void adam_family_step(std::string_view op, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                      const Tensor& exp_avg_sq, const Tensor* max_exp_avg_sq, int64_t step, const AdamOptions& options,
                      cpu::WeightDecay decay) {
  check_adam_options(op, options.lr, options.beta1, options.beta2, options.eps, options.weight_decay);
  check_step_count(op, step);
  if (max_exp_avg_sq != nullptr) {
    check_step_tensors(op, param, grad,
                       {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}, {"max_exp_avg_sq", max_exp_avg_sq}});
  } else {
    check_step_tensors(op, param, grad, {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}});
  }
  const trace::Span span(op, trace::Category::kKernel);
  switch (param.device().type) {
    case kCPU: cpu::adam_step(param, exp_avg, exp_avg_sq, max_exp_avg_sq, grad, step, options, decay); return;
    case kCUDA: {
      const int device = param.device().index;
      cuda::adam_step(param.data(), exp_avg.data(), exp_avg_sq.data(),
                      max_exp_avg_sq != nullptr ? max_exp_avg_sq->data() : nullptr, grad.data(), param.numel(),
                      adam_scalars(options.lr, options.beta1, options.beta2, options.eps, options.weight_decay, step,
                                   decay == cpu::WeightDecay::kDecoupled),
                      param.dtype(), device, cuda::current_stream(device).handle());
      return;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace

DType optimizer_state_dtype(DType param_dtype) { return state_dtype_for("optimizer_state_dtype", param_dtype); }

void sgd_step_(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, int64_t step, const SgdOptions& options) {
  constexpr std::string_view op = "sgd_step_";
  DTR_CHECK(options.lr >= 0.0, ValueError, "{}: invalid lr {}; it must be >= 0", op, options.lr);
  DTR_CHECK(options.momentum >= 0.0, ValueError, "{}: invalid momentum {}; it must be >= 0", op, options.momentum);
  DTR_CHECK(options.weight_decay >= 0.0, ValueError, "{}: invalid weight_decay {}; it must be >= 0", op,
            options.weight_decay);
  DTR_CHECK(!options.nesterov || (options.momentum > 0.0 && options.dampening == 0.0), ValueError,
            "{}: nesterov needs momentum > 0 and dampening 0 (got momentum {}, dampening {})", op, options.momentum,
            options.dampening);
  check_step_count(op, step);
  if (options.momentum != 0.0) {
    check_step_tensors(op, param, grad, {{"momentum_buffer", &momentum_buffer}});
  } else {
    check_step_tensors(op, param, grad, {});
  }
  const trace::Span span("sgd_step_", trace::Category::kKernel);
  switch (param.device().type) {
    case kCPU: cpu::sgd_step(param, momentum_buffer, grad, step, options); return;
    case kCUDA: {
      const int device = param.device().index;
      const cuda::SgdScalars s{.lr = options.lr,
                               .weight_decay = options.weight_decay,
                               .momentum = options.momentum,
                               .keep = 1.0 - options.dampening,
                               .nesterov = options.nesterov,
                               .first_step = step == 1};
      cuda::sgd_step(param.data(), options.momentum != 0.0 ? momentum_buffer.data() : nullptr, grad.data(),
                     param.numel(), s, param.dtype(), device, cuda::current_stream(device).handle());
      return;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

void adam_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, int64_t step,
                const AdamOptions& options, Tensor* max_exp_avg_sq) {
  adam_family_step("adam_step_", param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, options,
                   cpu::WeightDecay::kL2);
}

void adamw_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, int64_t step,
                 const AdamWOptions& options, Tensor* max_exp_avg_sq) {
  const AdamOptions adam{.lr = options.lr,
                         .beta1 = options.beta1,
                         .beta2 = options.beta2,
                         .eps = options.eps,
                         .weight_decay = options.weight_decay};
  adam_family_step("adamw_step_", param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, adam,
                   cpu::WeightDecay::kDecoupled);
}

}  // namespace dtr
