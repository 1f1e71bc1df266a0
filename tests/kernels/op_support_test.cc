// The op coverage table (kernels/op_support.h) against the kernels: every op runs on every
// dtype its CPU column lists, and raises a typed error (TypeError or NotImplementedError)
// on every other dtype (the CUDA column likewise, tagged [gpu]); the table and the runners
// below name the same ops.
#include "kernels/op_support.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fill.h"
#include "kernels/index.h"
#include "kernels/layer_norm.h"
#include "kernels/matmul.h"
#include "kernels/optimizer_step.h"
#include "kernels/random.h"
#include "kernels/reduce.h"
#include "kernels/relu_mask.h"
#include "kernels/rms_norm.h"
#include "kernels/shape_ops.h"
#include "kernels/softmax.h"

namespace dtr {
namespace {

using Runner = std::function<void(DType)>;

// Where the runners' tensors live: the CPU, or a GPU for the [gpu] case.
Device g_device = kCPU;

Tensor x_of(DType d) { return ones({2, 3}, d, g_device); }
Tensor mask() { return ones({2, 3}, kBool, g_device); }
Tensor rows() { return Tensor::from_vector<int64_t>({0, 1}).to(g_device); }

Runner unary(Tensor (*op)(const Tensor&)) {
  return [op](DType d) { op(x_of(d)); };
}
Runner binary(Tensor (*op)(const Tensor&, const Tensor&)) {
  return [op](DType d) { op(x_of(d), x_of(d)); };
}

// One call of each op on small CPU tensors whose dispatching operand has dtype d.
std::map<std::string_view, Runner> runners() {
  using TT = Tensor (*)(const Tensor&, const Tensor&);
  using TS = Tensor (*)(const Tensor&, double);
  return {
      {"copy_",
       [](DType d) {
         Tensor::empty({2, 3}, d, g_device).copy_(x_of(kFloat32));
       }},
      {"fill_",
       [](DType d) {
         Tensor t = Tensor::empty({2, 3}, d, g_device);
         fill_(t, 1.0);
       }},
      {"arange", [](DType d) { arange(0, 4, 1, d, g_device); }},
      {"add",
       [](DType d) {
         add(x_of(d), x_of(d));
         static_cast<TS>(add)(x_of(d), 1.0);
       }},
      {"sub",
       [](DType d) {
         sub(x_of(d), x_of(d));
         static_cast<TS>(sub)(x_of(d), 1.0);
       }},
      {"mul",
       [](DType d) {
         mul(x_of(d), x_of(d));
         static_cast<TS>(mul)(x_of(d), 1.0);
       }},
      {"div",
       [](DType d) {
         div(x_of(d), x_of(d));
         static_cast<TS>(div)(x_of(d), 1.0);
       }},
      {"maximum", binary(maximum)},
      {"minimum", binary(minimum)},
      {"rsub", [](DType d) { rsub(x_of(d), 1.0); }},
      {"pow", [](DType d) { pow(x_of(d), 2.0); }},
      {"add_",
       [](DType d) {
         Tensor y = x_of(d);
         add_(y, x_of(d), 1.0);
       }},
      {"mul_",
       [](DType d) {
         Tensor y = x_of(d);
         mul_(y, 1.0);
       }},
      {"relu_",
       [](DType d) {
         Tensor y = x_of(d);
         relu_(y);
       }},
      {"neg", unary(neg)},
      {"abs", unary(abs)},
      {"relu", unary(relu)},
      {"exp", unary(exp)},
      {"log", unary(log)},
      {"sqrt", unary(sqrt)},
      {"rsqrt", unary(rsqrt)},
      {"tanh", unary(tanh)},
      {"sigmoid", unary(sigmoid)},
      {"gelu", [](DType d) { gelu(x_of(d), GeluApproximation::kNone); }},
      {"silu", unary(silu)},
      {"clamp", [](DType d) { clamp(x_of(d), 0.0, 1.0); }},
      {"relu_backward", binary(relu_backward)},
      {"gelu_backward", [](DType d) { gelu_backward(x_of(d), x_of(d), GeluApproximation::kNone); }},
      {"silu_backward", binary(silu_backward)},
      {"sigmoid_backward", binary(sigmoid_backward)},
      {"tanh_backward", binary(tanh_backward)},
      {"eq",
       [](DType d) {
         static_cast<TT>(eq)(x_of(d), x_of(d));
         static_cast<TS>(eq)(x_of(d), 1.0);
       }},
      {"ne",
       [](DType d) {
         static_cast<TT>(ne)(x_of(d), x_of(d));
         static_cast<TS>(ne)(x_of(d), 1.0);
       }},
      {"lt",
       [](DType d) {
         static_cast<TT>(lt)(x_of(d), x_of(d));
         static_cast<TS>(lt)(x_of(d), 1.0);
       }},
      {"le",
       [](DType d) {
         static_cast<TT>(le)(x_of(d), x_of(d));
         static_cast<TS>(le)(x_of(d), 1.0);
       }},
      {"gt",
       [](DType d) {
         static_cast<TT>(gt)(x_of(d), x_of(d));
         static_cast<TS>(gt)(x_of(d), 1.0);
       }},
      {"ge",
       [](DType d) {
         static_cast<TT>(ge)(x_of(d), x_of(d));
         static_cast<TS>(ge)(x_of(d), 1.0);
       }},
      {"logical_not", unary(logical_not)},
      {"where", [](DType d) { where(mask(), x_of(d), x_of(d)); }},
      {"masked_fill", [](DType d) { masked_fill(x_of(d), mask(), 0.0); }},
      {"relu_mask", [](DType d) { relu_mask(x_of(d)); }},
      {"apply_relu_mask_",
       [](DType d) {
         Tensor g = x_of(d);
         apply_relu_mask_(g, relu_mask(x_of(kFloat32)));
       }},
      {"sum", [](DType d) { sum(x_of(d)); }},
      {"mean", [](DType d) { mean(x_of(d)); }},
      {"max", [](DType d) { max(x_of(d)); }},
      {"min", [](DType d) { min(x_of(d)); }},
      {"sum_of_squares", [](DType d) { sum_of_squares(x_of(d)); }},
      {"argmax", [](DType d) { argmax(x_of(d), 1); }},
      {"cat",
       [](DType d) {
         cat({x_of(d), x_of(d)}, 0);
       }},
      {"index_select", [](DType d) { index_select(x_of(d), 0, rows()); }},
      {"gather",
       [](DType d) {
         gather(x_of(d), 0, zeros({2, 3}, kInt64, g_device));
       }},
      {"index_add_",
       [](DType d) {
         Tensor y = x_of(d);
         index_add_(y, 0, rows(), x_of(d));
       }},
      {"scatter_add_",
       [](DType d) {
         Tensor y = x_of(d);
         scatter_add_(y, 0, zeros({2, 3}, kInt64, g_device), x_of(d));
       }},
      {"matmul",
       [](DType d) {
         matmul(x_of(d), ones({3, 2}, d, g_device));
       }},
      {"bmm",
       [](DType d) {
         bmm(ones({1, 2, 3}, d, g_device), ones({1, 3, 2}, d, g_device));
       }},
      {"matmul_bias",
       [](DType d) {
         matmul_bias(x_of(d), ones({3, 2}, d, g_device), ones({2}, d, g_device), MatmulEpilogue::kBiasGeluTanh);
         matmul_bias_gelu(x_of(d), ones({3, 2}, d, g_device), ones({2}, d, g_device));
       }},
      {"uniform_",
       [](DType d) {
         Tensor t = x_of(d);
         uniform_(t, 0.0, 1.0, 1);
       }},
      {"normal_",
       [](DType d) {
         Tensor t = x_of(d);
         normal_(t, 0.0, 1.0, 1);
       }},
      {"bernoulli",
       [](DType d) {
         bernoulli({2, 3}, 0.5, 1, d, std::nullopt, g_device);
       }},
      {"dropout", [](DType d) { dropout(x_of(d), 0.5, 1); }},
      {"dropout_backward", [](DType d) { dropout_backward(x_of(d), mask(), 0.5); }},
      {"softmax", [](DType d) { softmax(x_of(d), 1); }},
      {"log_softmax", [](DType d) { log_softmax(x_of(d), 1); }},
      {"softmax_backward", [](DType d) { softmax_backward(x_of(d), x_of(d), 1); }},
      {"log_softmax_backward", [](DType d) { log_softmax_backward(x_of(d), x_of(d), 1); }},
      {"layer_norm", [](DType d) { layer_norm(x_of(d), {3}, std::nullopt, std::nullopt); }},
      {"layer_norm_backward",
       [](DType d) {
         const Tensor stats = ones({2}, acc_dtype(d), g_device);
         layer_norm_backward(x_of(d), x_of(d), stats, stats, std::nullopt);
       }},
      {"rms_norm", [](DType d) { rms_norm(x_of(d), {3}, std::nullopt); }},
      {"rms_norm_backward",
       [](DType d) { rms_norm_backward(x_of(d), x_of(d), ones({2}, acc_dtype(d), g_device), std::nullopt); }},
      {"embedding", [](DType d) { embedding(x_of(d), rows()); }},
      {"embedding_backward", [](DType d) { embedding_backward(x_of(d), rows(), 2); }},
      {"cross_entropy", [](DType d) { cross_entropy(x_of(d), rows()); }},
      {"cross_entropy_backward",
       [](DType d) {
         cross_entropy_backward(ones({}, kFloat32, g_device), x_of(d), rows(), zeros({2}, acc_dtype(d), g_device));
       }},
      {"attention", [](DType d) { attention(x_of(d), x_of(d), x_of(d), Causal::kYes, 0.5); }},
      {"attention_backward",
       [](DType d) {
         const AttentionOutput f = attention(x_of(d), x_of(d), x_of(d), Causal::kYes, 0.5);
         attention_backward(x_of(d), x_of(d), x_of(d), x_of(d), f.out, f.lse, Causal::kYes, 0.5);
       }},
      {"sgd_step_",
       [](DType d) {
         Tensor p = x_of(d), buffer;
         sgd_step_(p, x_of(d), buffer, 1, {});
       }},
      {"adam_step_",
       [](DType d) {
         Tensor p = x_of(d), m = zeros({2, 3}, optimizer_state_dtype(d), g_device),
                v = zeros({2, 3}, optimizer_state_dtype(d), g_device);
         adam_step_(p, x_of(d), m, v, 1, {});
       }},
      {"adamw_step_",
       [](DType d) {
         Tensor p = x_of(d), m = zeros({2, 3}, optimizer_state_dtype(d), g_device),
                v = zeros({2, 3}, optimizer_state_dtype(d), g_device);
         adamw_step_(p, x_of(d), m, v, 1, {});
       }},
  };
}

constexpr DType kDTypes[] = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kBool};

}  // namespace

TEST_CASE("the op table and the runners name the same ops, each once") {
  const auto all = runners();
  std::set<std::string_view> listed;
  for (const OpSupport& s : supported_ops()) {
    INFO("op " << s.op);
    CHECK(listed.insert(s.op).second);
    CHECK(all.count(s.op) == 1);
  }
  CHECK(listed.size() == all.size());
}

// Every op runs on each dtype the table lists for `device`, and raises a typed error on
// every other dtype.
void check_column(Device device) {
  g_device = device;
  const auto all = runners();
  for (const OpSupport& s : supported_ops()) {
    const Runner& run = all.at(s.op);
    const DTypeSet& listed = s.on(device.type);
    for (DType d : kDTypes) {
      INFO("op " << s.op << " on " << fmt::format("{}", device) << " " << dtype_name(d) << " (table: " << listed.str()
                 << ")");
      if (listed.contains(d)) {
        CHECK_NOTHROW(run(d));
        continue;
      }
      try {
        run(d);
        FAIL_CHECK("ran on a dtype the table does not list");
      } catch (const TypeError&) {
      } catch (const NotImplementedError&) {}
    }
  }
  g_device = kCPU;
}

TEST_CASE("every op runs on exactly the CPU dtypes the table lists") { check_column(kCPU); }

TEST_CASE("every op runs on exactly the CUDA dtypes the table lists", "[gpu]") { check_column(Device(kCUDA, 0)); }

TEST_CASE("supports() answers from the table and rejects unknown ops") {
  CHECK(supports("softmax", kCPU, kBFloat16));
  CHECK_FALSE(supports("softmax", kCPU, kInt64));
  CHECK(supports("dropout", kCUDA, kFloat32));
  CHECK_FALSE(supports("index_add_", kCUDA, kBool));
  CHECK(supports("softmax", kCUDA, kFloat32));
  CHECK(supports("fill_", kCUDA, kBool));
  CHECK_THROWS_AS(supports("no_such_op", kCPU, kFloat32), ValueError);
  CHECK_THAT(
      op_support_markdown(),
      Catch::Contains("| `dropout` | float32, float64, bfloat16, float16 | float32, float64, bfloat16, float16 |"));
}

TEST_CASE("docs/op_support.md holds the table") {
  std::ifstream in("docs/op_support.md");
  REQUIRE(in.good());
  std::stringstream doc;
  doc << in.rdbuf();
  INFO("docs/op_support.md must contain this table (paste it in):\n" << op_support_markdown());
  CHECK_THAT(doc.str(), Catch::Contains(op_support_markdown()));
}

}  // namespace dtr
