// Normalisation layers: LayerNorm and RMSNorm (torch.nn.LayerNorm, torch.nn.RMSNorm).
#pragma once

#include <optional>

#include "nn/module.h"
#include "nn/parameter.h"

namespace dtr::nn {

// Normalises over the last dims `normalized_shape`; weight ones and bias zeros when
// elementwise_affine (bias only when `bias`).
class LayerNorm : public UnaryModule {
 public:
  LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true,
            const ParameterOptions& options = {});
  std::string extra_repr() const override;

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& x) override;

 private:
  Shape normalized_shape_;
  double eps_;
  bool elementwise_affine_;
  DTensor& weight_;
  DTensor& bias_;
};

// x / sqrt(mean(x^2) + eps) * weight over the last dims, one fused op (dtensor/ops/rms_norm.h);
// eps defaults to the machine epsilon of x's dtype, as in PyTorch.
class RMSNorm : public UnaryModule {
 public:
  RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt, bool elementwise_affine = true,
          const ParameterOptions& options = {});
  std::string extra_repr() const override;

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& x) override;

 private:
  Shape normalized_shape_;
  std::optional<double> eps_;
  DTensor& weight_;
};

}  // namespace dtr::nn
