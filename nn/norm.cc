#include "nn/norm.h"

#include "core/error.h"
#include "core/trace.h"
#include "dtensor/ops/layer_norm.h"
#include "dtensor/ops/rms_norm.h"
#include "nn/init.h"

namespace dtr::nn {
namespace {

std::string shape_tuple(const Shape& s) {
  return s.size() == 1 ? fmt::format("({},)", s[0]) : fmt::format("({})", fmt::join(s, ", "));
}

// x must end in the dims normalized_shape names.
void check_normalized_shape(const DTensor& x, const Shape& normalized_shape, std::string_view op) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool fits = x.dim() >= k;
  for (int64_t i = 0; fits && i < k; ++i) fits = x.size(x.dim() - k + i) == normalized_shape[i];
  DTR_CHECK(fits, ValueError, "{}: input of shape {} does not end in normalized_shape {}", op, x.shape(),
            normalized_shape);
}

}  // namespace

LayerNorm::LayerNorm(Shape normalized_shape, const LayerNormOptions& options, const ParameterOptions& parameters)
    : UnaryModule("LayerNorm"),
      normalized_shape_(std::move(normalized_shape)),
      eps_(options.eps),
      elementwise_affine_(options.elementwise_affine),
      weight_(register_parameter(
          "weight", options.elementwise_affine ? empty_parameter(normalized_shape_, parameters) : DTensor())),
      bias_(register_parameter("bias", options.elementwise_affine && options.bias
                                           ? empty_parameter(normalized_shape_, parameters)
                                           : DTensor())) {
  if (weight_.defined()) ones_(weight_);
  if (bias_.defined()) zeros_(bias_);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", shape_tuple(normalized_shape_), eps_,
                     elementwise_affine_ ? "True" : "False");
}

DTensor LayerNorm::forward(const DTensor& x) {
  const trace::Region region("norm");
  check_normalized_shape(x, normalized_shape_, "LayerNorm");
  const auto optional = [](const DTensor& t) { return t.defined() ? std::optional<DTensor>(t) : std::nullopt; };
  return layer_norm(x, normalized_shape_, optional(weight_), optional(bias_), eps_);
}

RMSNorm::RMSNorm(Shape normalized_shape, const RMSNormOptions& options, const ParameterOptions& parameters)
    : UnaryModule("RMSNorm"),
      normalized_shape_(std::move(normalized_shape)),
      eps_(options.eps),
      weight_(register_parameter(
          "weight", options.elementwise_affine ? empty_parameter(normalized_shape_, parameters) : DTensor())) {
  if (weight_.defined()) ones_(weight_);
}

std::string RMSNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", shape_tuple(normalized_shape_),
                     eps_ ? fmt::format("{}", *eps_) : "None", weight_.defined() ? "True" : "False");
}

DTensor RMSNorm::forward(const DTensor& x) {
  const trace::Region region("norm");
  check_normalized_shape(x, normalized_shape_, "RMSNorm");
  const std::optional<DTensor> weight = weight_.defined() ? std::optional<DTensor>(weight_) : std::nullopt;
  return rms_norm(x, normalized_shape_, weight, eps_);  // eps_ unset: the machine epsilon of x's dtype
}

}  // namespace dtr::nn
