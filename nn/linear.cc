#include "nn/linear.h"

#include <cmath>

#include "core/error.h"
#include "dtensor/ops/matmul.h"
#include "nn/init.h"

namespace dtr::nn {

Linear::Linear(int64_t in_features, int64_t out_features, const LinearOptions& options,
               const ParameterOptions& parameters)
    : UnaryModule("Linear"),
      in_features_(in_features),
      out_features_(out_features),
      weight_(register_parameter("weight", empty_parameter({out_features, in_features}, parameters))),
      bias_(register_parameter("bias", options.bias ? empty_parameter({out_features}, parameters) : DTensor())) {
  DTR_CHECK(in_features > 0 && out_features > 0, ValueError,
            "Linear: in_features {} and out_features {} must be positive", in_features, out_features);
  kaiming_uniform_(weight_, std::sqrt(5.0));
  if (options.bias) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    uniform_(bias_, -bound, bound);
  }
}

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features_, out_features_,
                     bias_.defined() ? "True" : "False");
}

DTensor Linear::forward(const DTensor& x) {
  return linear(x, weight_, bias_.defined() ? std::optional<DTensor>(bias_) : std::nullopt);
}

}  // namespace dtr::nn
