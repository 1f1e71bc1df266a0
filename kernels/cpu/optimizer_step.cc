#include "kernels/cpu/optimizer_step.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/parallel.h"
#include "kernels/adam_scalars.h"

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

// The loops take raw pointers and scalars by value, and options that change the body are
// template arguments: GCC vectorizes only branch-free bodies whose pointers it can see.

template <class T, bool kWeightDecay, bool kMomentum, bool kNesterov>
void sgd_loop(T* p, const T* g, acc_t<T>* buffer, int64_t n, bool first_step, acc_t<T> lr, acc_t<T> weight_decay,
              acc_t<T> momentum, acc_t<T> keep) {
  using C = acc_t<T>;
#pragma omp parallel for simd schedule(static) num_threads(num_threads()) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const C pi = convert<C>(p[i]);
    C gi = convert<C>(g[i]);
    if constexpr (kWeightDecay) gi += weight_decay * pi;
    if constexpr (kMomentum) {
      const C bi = first_step ? gi : momentum * buffer[i] + keep * gi;
      buffer[i] = bi;
      gi = kNesterov ? gi + momentum * bi : bi;
    }
    p[i] = convert<T>(pi - lr * gi);
  }
}

template <class T, bool kL2, bool kAmsgrad>
void adam_loop(T* p, const T* g, acc_t<T>* m, acc_t<T>* v, acc_t<T>* v_max, int64_t n, const AdamScalars<acc_t<T>> s) {
  using C = acc_t<T>;
#pragma omp parallel for simd schedule(static) num_threads(num_threads()) if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const C pi = convert<C>(p[i]) * s.scale;
    C gi = convert<C>(g[i]);
    if constexpr (kL2) gi += s.l2 * pi;
    const C mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
    const C vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    C denominator = vi;
    if constexpr (kAmsgrad) {
      denominator = std::max(v_max[i], vi);
      v_max[i] = denominator;
    }
    p[i] = convert<T>(pi - s.step_size * mi / (std::sqrt(denominator) / s.bias_correction2_sqrt + s.eps));
  }
}

}  // namespace

void sgd_step(const Tensor& param, const Tensor& momentum_buffer, const Tensor& grad, int64_t step,
              const SgdOptions& options) {
  dispatch_param(param.dtype(), "sgd_step_", [&]<class T>(TypeTag<T>) {
    using C = acc_t<T>;
    T* p = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    const int64_t n = param.numel();
    const C lr = static_cast<C>(options.lr), weight_decay = static_cast<C>(options.weight_decay);
    const C momentum = static_cast<C>(options.momentum), keep = static_cast<C>(1.0 - options.dampening);
    const bool first_step = step == 1;
    C* buffer = options.momentum != 0.0 ? momentum_buffer.data_ptr<C>() : nullptr;
    // Each argument is std::true_type or std::false_type: the loop variant to run.
    auto run = [&](auto decay_on, auto momentum_on, auto nesterov_on) {
      sgd_loop<T, decltype(decay_on)::value, decltype(momentum_on)::value, decltype(nesterov_on)::value>(
          p, g, buffer, n, first_step, lr, weight_decay, momentum, keep);
    };
    auto with_momentum = [&](auto decay_on) {
      if (options.momentum == 0.0) {
        run(decay_on, std::false_type{}, std::false_type{});
      } else if (options.nesterov) {
        run(decay_on, std::true_type{}, std::true_type{});
      } else {
        run(decay_on, std::true_type{}, std::false_type{});
      }
    };
    if (options.weight_decay != 0.0) {
      with_momentum(std::true_type{});
    } else {
      with_momentum(std::false_type{});
    }
  });
}

void adam_step(const Tensor& param, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor* max_exp_avg_sq,
               const Tensor& grad, int64_t step, const AdamOptions& options, WeightDecay decay) {
  const char* op = decay == WeightDecay::kL2 ? "adam_step_" : "adamw_step_";
  dispatch_param(param.dtype(), op, [&]<class T>(TypeTag<T>) {
    using C = acc_t<T>;
    const AdamScalars<C> s = adam_scalars(options.lr, options.beta1, options.beta2, options.eps, options.weight_decay,
                                          step, decay == WeightDecay::kDecoupled)
                                 .as<C>();
    T* p = param.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    C* m = exp_avg.data_ptr<C>();
    C* v = exp_avg_sq.data_ptr<C>();
    C* v_max = max_exp_avg_sq != nullptr ? max_exp_avg_sq->data_ptr<C>() : nullptr;
    // Each argument is std::true_type or std::false_type: the loop variant to run.
    auto run = [&](auto l2_on) {
      if (v_max != nullptr) {
        adam_loop<T, decltype(l2_on)::value, true>(p, g, m, v, v_max, param.numel(), s);
      } else {
        adam_loop<T, decltype(l2_on)::value, false>(p, g, m, v, v_max, param.numel(), s);
      }
    };
    if (decay == WeightDecay::kL2 && options.weight_decay != 0.0) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
  });
}

}  // namespace dtr::cpu
