// Activation and dropout layers: ReLU, GELU(approximate none | tanh), SiLU, Dropout.
#pragma once

#include "dtensor/ops/elementwise.h"
#include "nn/module.h"

namespace dtr::nn {

// inplace: PyTorch's ReLU(inplace=True), relu_ (dtensor/ops/elementwise.h): the input's
// buffer becomes the output where nothing else holds it (forward hooks then see the output
// in the input too, as PyTorch's do).
class ReLU : public UnaryModule {
 public:
  explicit ReLU(bool inplace = false) : UnaryModule("ReLU"), inplace_(inplace) {}
  std::string extra_repr() const override { return inplace_ ? "inplace=True" : ""; }

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& x) override { return inplace_ ? relu_(x) : relu(x); }

 private:
  bool inplace_;
};

class GELU : public UnaryModule {
 public:
  explicit GELU(GeluApproximation approximate = GeluApproximation::kNone)
      : UnaryModule("GELU"), approximate_(approximate) {}
  std::string extra_repr() const override {
    return approximate_ == GeluApproximation::kTanh ? "approximate='tanh'" : "approximate='none'";
  }

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& x) override { return gelu(x, approximate_); }

 private:
  GeluApproximation approximate_;
};

class SiLU : public UnaryModule {
 public:
  SiLU() : UnaryModule("SiLU") {}

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& x) override { return silu(x); }
};

// Zeroes elements with probability p and scales the rest by 1/(1-p) in training mode; the
// identity in eval mode. Each call draws a fresh seed (nn/init.h's sequence), so every
// rank drops the same global elements.
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5);
  std::string extra_repr() const override;

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& x) override;

 private:
  double p_;
};

}  // namespace dtr::nn
