#include "kernels/cpu/optimizer_step.h"

#include <cmath>

namespace dtr::cpu {

namespace {

// Parameters below this many elements are updated on one thread.
constexpr int64_t kParallelElements = int64_t{1} << 15;

// Calls f(TypeTag<T>{}) for the parameter types the optimizers support.
template <class F>
void dispatch_param(DType d, std::string_view op, F&& f) {
  switch (d) {
    case kFloat32: return f(TypeTag<float>{});
    case kFloat64: return f(TypeTag<double>{});
    case kBFloat16: return f(TypeTag<BFloat16>{});
    default: throw_dtype_not_implemented(op, d);
  }
}

}  // namespace

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, int64_t step,
              const SgdOptions& options) {
  dispatch_param(param.dtype(), "sgd_step_", [&]<class T>(TypeTag<T>) {
    using C = acc_t<T>;
    T* p = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    C* buffer = options.momentum != 0.0 ? momentum_buffer.data_ptr<C>() : nullptr;
    const C lr = static_cast<C>(options.lr), weight_decay = static_cast<C>(options.weight_decay);
    const C momentum = static_cast<C>(options.momentum), keep = static_cast<C>(1.0 - options.dampening);
    const bool first_step = step == 1, nesterov = options.nesterov;
    const int64_t n = param.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const C pi = convert<C>(p[i]);
      C gi = convert<C>(g[i]);
      if (weight_decay != 0) gi += weight_decay * pi;
      if (buffer != nullptr) {
        const C bi = first_step ? gi : momentum * buffer[i] + keep * gi;
        buffer[i] = bi;
        gi = nesterov ? gi + momentum * bi : bi;
      }
      p[i] = convert<T>(pi - lr * gi);
    }
  });
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t step,
               const AdamOptions& options, WeightDecay decay) {
  const char* op = decay == WeightDecay::kL2 ? "adam_step_" : "adamw_step_";
  dispatch_param(param.dtype(), op, [&]<class T>(TypeTag<T>) {
    using C = acc_t<T>;
    T* p = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    C* m = exp_avg.data_ptr<C>();
    C* v = exp_avg_sq.data_ptr<C>();
    const double t = static_cast<double>(step);
    // theta -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    const C step_size = static_cast<C>(options.lr / (1.0 - std::pow(options.beta1, t)));
    const C bias_correction2_sqrt = static_cast<C>(std::sqrt(1.0 - std::pow(options.beta2, t)));
    const C beta1 = static_cast<C>(options.beta1), beta2 = static_cast<C>(options.beta2);
    const C one_minus_beta1 = static_cast<C>(1.0 - options.beta1), one_minus_beta2 = static_cast<C>(1.0 - options.beta2);
    const C eps = static_cast<C>(options.eps);
    const C l2 = static_cast<C>(decay == WeightDecay::kL2 ? options.weight_decay : 0.0);
    const C scale = static_cast<C>(decay == WeightDecay::kDecoupled ? 1.0 - options.lr * options.weight_decay : 1.0);
    const int64_t n = param.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const C pi = convert<C>(p[i]) * scale;
      C gi = convert<C>(g[i]);
      if (l2 != 0) gi += l2 * pi;
      const C mi = beta1 * m[i] + one_minus_beta1 * gi;
      const C vi = beta2 * v[i] + one_minus_beta2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = convert<T>(pi - step_size * mi / (std::sqrt(vi) / bias_correction2_sqrt + eps));
    }
  });
}

}  // namespace dtr::cpu
