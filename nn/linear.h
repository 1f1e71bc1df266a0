// Linear (torch.nn.Linear): y = x W^T + b, weight [out_features, in_features].
#pragma once

#include "nn/module.h"
#include "nn/parameter.h"

namespace dtr::nn {

// torch.nn.Linear's keyword arguments: Linear(4, 8, {.bias = false}).
struct LinearOptions {
  bool bias = true;  // a learned bias [out_features]
};

class Linear : public UnaryModule {
 public:
  // PyTorch's initialisation: weight kaiming_uniform_(a = sqrt(5)), bias U(+-1/sqrt(in)).
  Linear(int64_t in_features, int64_t out_features, const LinearOptions& options = {},
         const ParameterOptions& parameters = {});
  DTensor& weight() { return weight_; }
  DTensor& bias() { return bias_; }  // undefined without a bias
  std::string extra_repr() const override;

 protected:
  using UnaryModule::forward;
  DTensor forward(const DTensor& x) override;

 private:
  int64_t in_features_, out_features_;
  DTensor& weight_;
  DTensor& bias_;
};

}  // namespace dtr::nn
