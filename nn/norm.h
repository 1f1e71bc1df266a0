// Normalisation layers: LayerNorm and RMSNorm (torch.nn.LayerNorm, torch.nn.RMSNorm).
#pragma once

#include <optional>

#include "nn/module.h"
#include "nn/parameter.h"

namespace dtr::nn {

// torch.nn.LayerNorm's keyword arguments: LayerNorm(Shape{6}, {.bias = false}).
struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;  // a learned weight (ones), and with `bias` a bias (zeros)
  bool bias = true;
};

// Normalises over the last dims `normalized_shape`; weight ones and bias zeros when
// elementwise_affine (bias only when `bias`).
class LayerNorm : public UnaryModule {
 public:
  LayerNorm(Shape normalized_shape, const LayerNormOptions& options = {}, const ParameterOptions& parameters = {});
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

// torch.nn.RMSNorm's keyword arguments.
struct RMSNormOptions {
  std::optional<double> eps = std::nullopt;  // unset: the machine epsilon of x's dtype (PyTorch's)
  bool elementwise_affine = true;            // a learned weight (ones)
};

// x / sqrt(mean(x^2) + eps) * weight over the last dims, one fused op (dtensor/ops/rms_norm.h).
class RMSNorm : public UnaryModule {
 public:
  RMSNorm(Shape normalized_shape, const RMSNormOptions& options = {}, const ParameterOptions& parameters = {});
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
