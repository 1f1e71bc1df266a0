#include "nn/norm.h"

#include <limits>

#include "dtensor/ops/layer_norm.h"
#include "dtensor/ops/pointwise.h"
#include "dtensor/ops/reduction.h"
#include "kernels/error.h"
#include "kernels/trace.h"
#include "nn/init.h"

namespace dtr::nn {
namespace {

std::string shape_tuple(const Shape& s) {
  return s.size() == 1 ? fmt::format("({},)", s[0]) : fmt::format("({})", fmt::join(s, ", "));
}

// The trailing dims of x that normalized_shape names, checked.
std::vector<int64_t> normalized_dims(const DTensor& x, const Shape& normalized_shape, std::string_view op) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool fits = x.dim() >= k;
  for (int64_t i = 0; fits && i < k; ++i) fits = x.size(x.dim() - k + i) == normalized_shape[i];
  DTR_CHECK(fits, ValueError, "{}: input of shape {} does not end in normalized_shape {}", op, x.shape(),
            normalized_shape);
  std::vector<int64_t> dims;
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) dims.push_back(i);
  return dims;
}

}  // namespace

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias,
                     const ParameterOptions& options)
    : UnaryModule("LayerNorm"),
      normalized_shape_(std::move(normalized_shape)),
      eps_(eps),
      elementwise_affine_(elementwise_affine),
      weight_(
          register_parameter("weight", elementwise_affine ? empty_parameter(normalized_shape_, options) : DTensor())),
      bias_(register_parameter("bias",
                               elementwise_affine && bias ? empty_parameter(normalized_shape_, options) : DTensor())) {
  if (weight_.defined()) ones_(weight_);
  if (bias_.defined()) zeros_(bias_);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", shape_tuple(normalized_shape_), eps_,
                     elementwise_affine_ ? "True" : "False");
}

DTensor LayerNorm::forward(const DTensor& x) {
  const trace::Region region("norm");
  normalized_dims(x, normalized_shape_, "LayerNorm");
  const auto optional = [](const DTensor& t) { return t.defined() ? std::optional<DTensor>(t) : std::nullopt; };
  return layer_norm(x, normalized_shape_, optional(weight_), optional(bias_), eps_);
}

RMSNorm::RMSNorm(Shape normalized_shape, std::optional<double> eps, bool elementwise_affine,
                 const ParameterOptions& options)
    : UnaryModule("RMSNorm"),
      normalized_shape_(std::move(normalized_shape)),
      eps_(eps),
      weight_(
          register_parameter("weight", elementwise_affine ? empty_parameter(normalized_shape_, options) : DTensor())) {
  if (weight_.defined()) ones_(weight_);
}

std::string RMSNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", shape_tuple(normalized_shape_),
                     eps_ ? fmt::format("{}", *eps_) : "None", weight_.defined() ? "True" : "False");
}

DTensor RMSNorm::forward(const DTensor& x) {
  const trace::Region region("norm");
  const std::vector<int64_t> dims = normalized_dims(x, normalized_shape_, "RMSNorm");
  double eps = eps_.value_or(0.0);
  if (!eps_) {
    eps = x.dtype() == kFloat64    ? std::numeric_limits<double>::epsilon()
          : x.dtype() == kBFloat16 ? 0.0078125
          : x.dtype() == kFloat16  ? 0.0009765625
                                   : std::numeric_limits<float>::epsilon();
  }
  DTensor y = mul(x, rsqrt(add(mean(mul(x, x), dims, KeepDim::kYes), eps)));
  return weight_.defined() ? mul(y, weight_) : y;
}

}  // namespace dtr::nn
