// The per-step scalars of Adam and AdamW (torch.optim's formulas), computed once per step
// in double and shared by the CPU and CUDA kernels (each converts them with as<C>()):
//   theta = theta * scale - step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
// with m, v the moments of the gradient (plus l2 * theta for Adam's weight decay).
#pragma once

#include <cmath>
#include <cstdint>

namespace dtr {

template <class C = double>
struct AdamScalars {
  C step_size;              // lr / (1 - beta1^t)
  C bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  C beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
  C l2;     // added as l2 * param to the gradient (Adam)
  C scale;  // param is first multiplied by it (AdamW: 1 - lr * wd)

  // The same scalars in a kernel's arithmetic type.
  template <class D>
  AdamScalars<D> as() const {
    return {static_cast<D>(step_size),
            static_cast<D>(bias_correction2_sqrt),
            static_cast<D>(beta1),
            static_cast<D>(beta2),
            static_cast<D>(one_minus_beta1),
            static_cast<D>(one_minus_beta2),
            static_cast<D>(eps),
            static_cast<D>(l2),
            static_cast<D>(scale)};
  }
};

// decoupled: AdamW's weight decay (scale), else Adam's (l2).
inline AdamScalars<> adam_scalars(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                                  bool decoupled) {
  const double t = static_cast<double>(step);
  return {.step_size = lr / (1.0 - std::pow(beta1, t)),
          .bias_correction2_sqrt = std::sqrt(1.0 - std::pow(beta2, t)),
          .beta1 = beta1,
          .beta2 = beta2,
          .one_minus_beta1 = 1.0 - beta1,
          .one_minus_beta2 = 1.0 - beta2,
          .eps = eps,
          .l2 = decoupled ? 0.0 : weight_decay,
          .scale = decoupled ? 1.0 - lr * weight_decay : 1.0};
}

}  // namespace dtr
