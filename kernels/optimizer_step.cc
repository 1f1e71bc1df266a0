#include "kernels/optimizer_step.h"

#include <map>
#include <utility>
#include <vector>

#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/adam_scalars.h"
#include "kernels/cpu/optimizer_step.h"
#include "kernels/cuda/optimizer_step.h"

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

// Runs cpu_step(t) for each CPU parameter of params, in order, and cuda_step(pointers,
// dtype, device, stream) once per device and dtype of the CUDA ones.
template <class CpuStep, class CudaStep>
void run_by_device(std::span<const StepTensors> params, CpuStep&& cpu_step, CudaStep&& cuda_step) {
  std::map<std::pair<int, DType>, std::vector<cuda::StepPointers>> runs;
  for (const StepTensors& t : params) {
    switch (t.param.device().type) {
      case kCPU: cpu_step(t); break;
      case kCUDA: {
        auto data = [](const Tensor& s) { return s.defined() ? s.data() : nullptr; };
        runs[{t.param.device().index, t.param.dtype()}].push_back(
            {.param = t.param.data(),
             .grad = t.grad.data(),
             .state = {data(t.state[0]), data(t.state[1]), data(t.state[2])},
             .n = t.param.numel()});
        break;
      }
    }
  }
  for (const auto& [where, pointers] : runs) {
    const auto [device, dtype] = where;
    cuda_step(std::span<const cuda::StepPointers>(pointers), dtype, device, cuda::current_stream(device).handle());
  }
}

// Adam and AdamW, which differ only in how weight decay applies: checks, then the devices.
void adam_family_step(std::string_view op, std::span<const StepTensors> params, int64_t step,
                      const AdamOptions& options, cpu::WeightDecay decay) {
  check_adam_options(op, options.lr, options.beta1, options.beta2, options.eps, options.weight_decay);
  check_step_count(op, step);
  for (const StepTensors& t : params) {
    const auto& [exp_avg, exp_avg_sq, max_exp_avg_sq] = t.state;
    if (max_exp_avg_sq.defined()) {
      check_step_tensors(op, t.param, t.grad,
                         {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}, {"max_exp_avg_sq", &max_exp_avg_sq}});
    } else {
      check_step_tensors(op, t.param, t.grad, {{"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}});
    }
  }
  const trace::Span span(op, trace::Category::kKernel);
  run_by_device(
      params,
      [&](const StepTensors& t) {
        const Tensor& v_max = t.state[2];
        cpu::adam_step(t.param, t.state[0], t.state[1], v_max.defined() ? &v_max : nullptr, t.grad, step, options,
                       decay);
      },
      [&](std::span<const cuda::StepPointers> pointers, DType dtype, int device, cudaStream_t stream) {
        cuda::adam_step(pointers,
                        adam_scalars(options.lr, options.beta1, options.beta2, options.eps, options.weight_decay, step,
                                     decay == cpu::WeightDecay::kDecoupled),
                        dtype, device, stream);
      });
}

// A single-tensor step as a list of one.
StepTensors one_step(const Tensor& param, const Tensor& grad, const Tensor& s0, const Tensor& s1 = {},
                     const Tensor* s2 = nullptr) {
  return {.param = param, .grad = grad, .state = {s0, s1, s2 != nullptr ? *s2 : Tensor()}};
}

AdamOptions as_adam(const AdamWOptions& options) {
  return {.lr = options.lr,
          .beta1 = options.beta1,
          .beta2 = options.beta2,
          .eps = options.eps,
          .weight_decay = options.weight_decay};
}

}  // namespace

DType optimizer_state_dtype(DType param_dtype) { return state_dtype_for("optimizer_state_dtype", param_dtype); }

void sgd_step_(std::span<const StepTensors> params, int64_t step, const SgdOptions& options) {
  constexpr std::string_view op = "sgd_step_";
  DTR_CHECK(options.lr >= 0.0, ValueError, "{}: invalid lr {}; it must be >= 0", op, options.lr);
  DTR_CHECK(options.momentum >= 0.0, ValueError, "{}: invalid momentum {}; it must be >= 0", op, options.momentum);
  DTR_CHECK(options.weight_decay >= 0.0, ValueError, "{}: invalid weight_decay {}; it must be >= 0", op,
            options.weight_decay);
  DTR_CHECK(!options.nesterov || (options.momentum > 0.0 && options.dampening == 0.0), ValueError,
            "{}: nesterov needs momentum > 0 and dampening 0 (got momentum {}, dampening {})", op, options.momentum,
            options.dampening);
  check_step_count(op, step);
  const bool momentum = options.momentum != 0.0;
  for (const StepTensors& t : params) {
    if (momentum) {
      check_step_tensors(op, t.param, t.grad, {{"momentum_buffer", &t.state[0]}});
    } else {
      check_step_tensors(op, t.param, t.grad, {});
    }
  }
  const trace::Span span("sgd_step_", trace::Category::kKernel);
  run_by_device(
      params, [&](const StepTensors& t) { cpu::sgd_step(t.param, t.state[0], t.grad, step, options); },
      [&](std::span<const cuda::StepPointers> pointers, DType dtype, int device, cudaStream_t stream) {
        cuda::SgdScalars s;
        s.lr = options.lr;
        s.weight_decay = options.weight_decay;
        s.momentum = options.momentum;
        s.keep = 1.0 - options.dampening;
        s.nesterov = options.nesterov;
        s.first_step = step == 1;
        cuda::sgd_step(pointers, s, dtype, device, stream);
      });
}

void adam_step_(std::span<const StepTensors> params, int64_t step, const AdamOptions& options) {
  adam_family_step("adam_step_", params, step, options, cpu::WeightDecay::kL2);
}

void adamw_step_(std::span<const StepTensors> params, int64_t step, const AdamWOptions& options) {
  adam_family_step("adamw_step_", params, step, as_adam(options), cpu::WeightDecay::kDecoupled);
}

void sgd_step_(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, int64_t step, const SgdOptions& options) {
  const StepTensors t = one_step(param, grad, momentum_buffer);
  sgd_step_(std::span(&t, 1), step, options);
}

void adam_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, int64_t step,
                const AdamOptions& options, Tensor* max_exp_avg_sq) {
  const StepTensors t = one_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq);
  adam_step_(std::span(&t, 1), step, options);
}

void adamw_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, int64_t step,
                 const AdamWOptions& options, Tensor* max_exp_avg_sq) {
  const StepTensors t = one_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq);
  adamw_step_(std::span(&t, 1), step, options);
}

}  // namespace dtr
