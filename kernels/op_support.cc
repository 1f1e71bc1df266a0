#include "kernels/op_support.h"

#include <algorithm>
#include <array>

#include "core/error.h"

namespace dtr {
namespace {

constexpr DTypeSet kNone;
constexpr DTypeSet kFloating{kFloat32, kFloat64, kBFloat16, kFloat16};
constexpr DTypeSet kNumeric{kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64};
constexpr DTypeSet kAll{kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kBool};
// The optimizers keep float32 state for 16-bit parameters, which float16 cannot use well.
constexpr DTypeSet kOptimizerParams{kFloat32, kFloat64, kBFloat16};

constexpr std::array kOps = {
    // tensor.h, fill.h: the two ops every device has.
    OpSupport{"copy_", kAll, kAll},
    OpSupport{"fill_", kAll, kAll},
    OpSupport{"arange", kNumeric, kNumeric},
    // elementwise.h
    OpSupport{"add", kNumeric, kNumeric},
    OpSupport{"sub", kNumeric, kNumeric},
    OpSupport{"mul", kNumeric, kNumeric},
    OpSupport{"div", kFloating, kFloating},
    OpSupport{"maximum", kNumeric, kNumeric},
    OpSupport{"minimum", kNumeric, kNumeric},
    OpSupport{"rsub", kNumeric, kNumeric},
    OpSupport{"pow", kFloating, kFloating},
    OpSupport{"add_", kNumeric, kNumeric},
    OpSupport{"mul_", kNumeric, kNumeric},
    OpSupport{"relu_", kNumeric, kNumeric},
    OpSupport{"neg", kNumeric, kNumeric},
    OpSupport{"abs", kNumeric, kNumeric},
    OpSupport{"relu", kNumeric, kNumeric},
    OpSupport{"exp", kFloating, kFloating},
    OpSupport{"log", kFloating, kFloating},
    OpSupport{"sqrt", kFloating, kFloating},
    OpSupport{"rsqrt", kFloating, kFloating},
    OpSupport{"tanh", kFloating, kFloating},
    OpSupport{"sigmoid", kFloating, kFloating},
    OpSupport{"gelu", kFloating, kFloating},
    OpSupport{"silu", kFloating, kFloating},
    OpSupport{"clamp", kNumeric, kNumeric},
    OpSupport{"relu_backward", kFloating, kFloating},
    OpSupport{"gelu_backward", kFloating, kFloating},
    OpSupport{"silu_backward", kFloating, kFloating},
    OpSupport{"sigmoid_backward", kFloating, kFloating},
    OpSupport{"tanh_backward", kFloating, kFloating},
    OpSupport{"eq", kAll, kAll},
    OpSupport{"ne", kAll, kAll},
    OpSupport{"lt", kAll, kAll},
    OpSupport{"le", kAll, kAll},
    OpSupport{"gt", kAll, kAll},
    OpSupport{"ge", kAll, kAll},
    OpSupport{"logical_not", kAll, kAll},
    OpSupport{"where", kAll, kAll},
    OpSupport{"masked_fill", kAll, kAll},
    // relu_mask.h
    OpSupport{"relu_mask", kFloating, kFloating},
    OpSupport{"apply_relu_mask_", kFloating, kFloating},
    // reduce.h
    OpSupport{"sum", kAll, kAll},
    OpSupport{"mean", kFloating, kFloating},
    OpSupport{"max", kAll, kAll},
    OpSupport{"min", kAll, kAll},
    OpSupport{"sum_of_squares", kFloating, kFloating},
    OpSupport{"argmax", kNumeric, kNumeric},
    // shape_ops.h, index.h
    OpSupport{"cat", kAll, kAll},
    OpSupport{"index_select", kAll, kAll},
    OpSupport{"gather", kAll, kAll},
    OpSupport{"index_add_", kNumeric, kNumeric},
    OpSupport{"scatter_add_", kNumeric, kNumeric},
    // matmul.h
    OpSupport{"matmul", kFloating, kFloating},
    OpSupport{"bmm", kFloating, kFloating},
    OpSupport{"matmul_bias", kFloating, kFloating},
    // random.h, dropout.h
    OpSupport{"uniform_", kFloating, kFloating},
    OpSupport{"normal_", kFloating, kFloating},
    OpSupport{"bernoulli", kAll, kAll},
    OpSupport{"dropout", kFloating, kFloating},
    OpSupport{"dropout_backward", kFloating, kFloating},
    // softmax.h, layer_norm.h, rms_norm.h, embedding.h, cross_entropy.h
    OpSupport{"softmax", kFloating, kFloating},
    OpSupport{"log_softmax", kFloating, kFloating},
    OpSupport{"softmax_backward", kFloating, kFloating},
    OpSupport{"log_softmax_backward", kFloating, kFloating},
    OpSupport{"layer_norm", kFloating, kFloating},
    OpSupport{"layer_norm_backward", kFloating, kFloating},
    OpSupport{"rms_norm", kFloating, kFloating},
    OpSupport{"rms_norm_backward", kFloating, kFloating},
    OpSupport{"embedding", kAll, kAll},
    OpSupport{"embedding_backward", kFloating, kFloating},
    OpSupport{"cross_entropy", kFloating, kFloating},
    OpSupport{"cross_entropy_backward", kFloating, kFloating},
    // attention.h
    OpSupport{"attention", kFloating, kFloating},
    OpSupport{"attention_backward", kFloating, kFloating},
    // optimizer_step.h
    OpSupport{"sgd_step_", kOptimizerParams, kOptimizerParams},
    OpSupport{"adam_step_", kOptimizerParams, kOptimizerParams},
    OpSupport{"adamw_step_", kOptimizerParams, kOptimizerParams},
};

constexpr std::array kAllDTypes = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kBool};

}  // namespace

std::vector<DType> DTypeSet::dtypes() const {
  std::vector<DType> out;
  for (DType d : kAllDTypes) {
    if (contains(d)) out.push_back(d);
  }
  return out;
}

std::string DTypeSet::str() const {
  std::vector<std::string_view> names;
  for (DType d : dtypes()) names.push_back(dtype_name(d));
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

std::span<const OpSupport> supported_ops() { return kOps; }

bool supports(std::string_view op, DeviceType device, DType dtype) {
  const auto row = std::find_if(kOps.begin(), kOps.end(), [&](const OpSupport& s) { return s.op == op; });
  DTR_CHECK(row != kOps.end(), ValueError, "supports: '{}' is not an op of kernels/ (see supported_ops())", op);
  return row->on(device).contains(dtype);
}

std::string op_support_markdown() {
  std::string out = "| op | cpu | cuda |\n|---|---|---|\n";
  for (const OpSupport& s : kOps) out += fmt::format("| `{}` | {} | {} |\n", s.op, s.cpu.str(), s.cuda.str());
  return out;
}

}  // namespace dtr
