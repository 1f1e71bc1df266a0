// The CUDA elementwise kernels (kernels/cuda/elementwise.h) against the CPU kernels on the
// same random inputs: every unary, scalar, binary, backward, comparison and select op, at
// sizes 1, 7, 1023, 4097 and a transformer activation's [8, 128, 256], in every dtype the op
// takes, on contiguous tensors (the vectorised path), non-contiguous views, broadcast
// operands and an offset view whose data is not 16-byte aligned (the strided path); plus
// in-place add_ and mul_ on a view, and the errors. Tagged gpu (Bazel) and [gpu] (Catch2):
// CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::random_tensor;
using testing::to_f64;

const Device kGpu(kCUDA, 0);

enum class Takes { kFloating, kNumeric, kAll };

std::vector<DType> dtypes(Takes t) {
  if (t == Takes::kFloating) return {std::begin(testing::kFloatDTypes), std::end(testing::kFloatDTypes)};
  if (t == Takes::kNumeric) return {std::begin(testing::kNumericDTypes), std::end(testing::kNumericDTypes)};
  return {std::begin(testing::kAllDTypes), std::end(testing::kAllDTypes)};
}

struct Case {
  std::string name;
  int arity;
  Takes takes;
  double lo, hi;  // the inputs' range
  std::function<Tensor(const std::vector<Tensor>&)> op;
};

std::vector<Case> cases() {
  using V = const std::vector<Tensor>&;
  return {
      {"neg", 1, Takes::kNumeric, -5, 5, [](V x) { return neg(x[0]); }},
      {"abs", 1, Takes::kNumeric, -5, 5, [](V x) { return abs(x[0]); }},
      {"relu", 1, Takes::kNumeric, -5, 5, [](V x) { return relu(x[0]); }},
      {"exp", 1, Takes::kFloating, -8, 8, [](V x) { return exp(x[0]); }},
      {"log", 1, Takes::kFloating, 0.01, 50, [](V x) { return log(x[0]); }},
      {"sqrt", 1, Takes::kFloating, 0, 50, [](V x) { return sqrt(x[0]); }},
      {"rsqrt", 1, Takes::kFloating, 0.01, 50, [](V x) { return rsqrt(x[0]); }},
      {"tanh", 1, Takes::kFloating, -6, 6, [](V x) { return tanh(x[0]); }},
      {"sigmoid", 1, Takes::kFloating, -20, 20, [](V x) { return sigmoid(x[0]); }},
      {"gelu", 1, Takes::kFloating, -6, 6, [](V x) { return gelu(x[0], GeluApproximation::kNone); }},
      {"gelu tanh", 1, Takes::kFloating, -6, 6, [](V x) { return gelu(x[0], GeluApproximation::kTanh); }},
      {"silu", 1, Takes::kFloating, -8, 8, [](V x) { return silu(x[0]); }},
      {"clamp", 1, Takes::kNumeric, -9, 9, [](V x) { return clamp(x[0], -2.0, 3.0); }},
      {"clamp min", 1, Takes::kNumeric, -9, 9, [](V x) { return clamp(x[0], -2.0, std::nullopt); }},
      {"add scalar", 1, Takes::kNumeric, -9, 9, [](V x) { return add(x[0], 3.0); }},
      {"sub scalar", 1, Takes::kNumeric, -9, 9, [](V x) { return sub(x[0], 2.0); }},
      {"mul scalar", 1, Takes::kNumeric, -9, 9, [](V x) { return mul(x[0], -3.0); }},
      {"div scalar", 1, Takes::kFloating, -9, 9, [](V x) { return div(x[0], 4.0); }},
      {"rsub", 1, Takes::kNumeric, -9, 9, [](V x) { return rsub(x[0], 1.0); }},
      {"pow 2", 1, Takes::kFloating, -3, 3, [](V x) { return pow(x[0], 2.0); }},
      {"pow 1.5", 1, Takes::kFloating, 0, 3, [](V x) { return pow(x[0], 1.5); }},
      {"gt scalar", 1, Takes::kAll, -3, 3, [](V x) { return gt(x[0], 0.0); }},
      {"eq scalar", 1, Takes::kAll, -3, 3, [](V x) { return eq(x[0], 1.0); }},
      {"logical_not", 1, Takes::kAll, -2, 2, [](V x) { return logical_not(x[0]); }},
      {"add", 2, Takes::kNumeric, -9, 9, [](V x) { return add(x[0], x[1]); }},
      {"sub", 2, Takes::kNumeric, -9, 9, [](V x) { return sub(x[0], x[1]); }},
      {"mul", 2, Takes::kNumeric, -9, 9, [](V x) { return mul(x[0], x[1]); }},
      {"div", 2, Takes::kFloating, 0.5, 9, [](V x) { return div(x[0], x[1]); }},
      {"maximum", 2, Takes::kNumeric, -9, 9, [](V x) { return maximum(x[0], x[1]); }},
      {"minimum", 2, Takes::kNumeric, -9, 9, [](V x) { return minimum(x[0], x[1]); }},
      {"relu_backward", 2, Takes::kFloating, -3, 3, [](V x) { return relu_backward(x[0], x[1]); }},
      {"gelu_backward", 2, Takes::kFloating, -4, 4,
       [](V x) { return gelu_backward(x[0], x[1], GeluApproximation::kNone); }},
      {"gelu_backward tanh", 2, Takes::kFloating, -4, 4,
       [](V x) { return gelu_backward(x[0], x[1], GeluApproximation::kTanh); }},
      {"silu_backward", 2, Takes::kFloating, -4, 4, [](V x) { return silu_backward(x[0], x[1]); }},
      {"sigmoid_backward", 2, Takes::kFloating, 0, 1, [](V x) { return sigmoid_backward(x[0], x[1]); }},
      {"tanh_backward", 2, Takes::kFloating, -1, 1, [](V x) { return tanh_backward(x[0], x[1]); }},
      {"lt", 2, Takes::kAll, -2, 2, [](V x) { return lt(x[0], x[1]); }},
      {"ge", 2, Takes::kAll, -2, 2, [](V x) { return ge(x[0], x[1]); }},
      {"ne", 2, Takes::kAll, -2, 2, [](V x) { return ne(x[0], x[1]); }},
      {"masked_fill", 2, Takes::kAll, -2, 2, [](V x) { return masked_fill(x[0], gt(x[1], 0.0), 1.0); }},
      {"where", 3, Takes::kAll, -2, 2, [](V x) { return where(gt(x[0], 0.0), x[1], x[2]); }},
  };
}

// An operand on both devices: the same values, in the same layout.
struct Operand {
  Tensor cpu, gpu;
};

Operand contiguous(const Tensor& t) { return {t, t.to(kGpu)}; }

// Every other element along the last dim of a buffer twice as long (copied to the GPU
// whole, so the GPU view has the CPU view's strides).
Operand strided(const Tensor& t) {
  Shape big = t.shape();
  big.back() *= 2;
  Tensor buffer = zeros(big, t.dtype());
  Tensor view = buffer.slice(-1, 0, big.back(), 2);
  view.copy_(t);
  return {view, buffer.to(kGpu).slice(-1, 0, big.back(), 2)};
}

// The op on the GPU against the op on the CPU.
void check_case(const Case& c, const std::vector<Operand>& inputs, const std::string& what) {
  std::vector<Tensor> cpu_inputs, gpu_inputs;
  for (const Operand& o : inputs) {
    cpu_inputs.push_back(o.cpu);
    gpu_inputs.push_back(o.gpu);
  }
  const Tensor expected = c.op(cpu_inputs);
  const Tensor got = c.op(gpu_inputs);
  REQUIRE(got.device() == kGpu);
  REQUIRE(got.shape() == expected.shape());
  REQUIRE(got.dtype() == expected.dtype());
  check_close(got, expected, what);
}

TEST_CASE("every CUDA elementwise op matches the CPU kernel, contiguous and strided", "[gpu]") {
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    for (DType d : dtypes(c.takes)) {
      for (const Shape& shape : std::vector<Shape>{{1}, {7}, {1023}, {4097}, {8, 128, 256}}) {
        std::vector<Operand> dense, views;
        for (int k = 0; k < c.arity; ++k) {
          const Tensor t = random_tensor(shape, d, seed++, c.lo, c.hi);
          dense.push_back(contiguous(t));
          views.push_back(strided(t));
        }
        check_case(c, dense, fmt::format("{} {} {} contiguous", c.name, dtype_name(d), shape));
        check_case(c, views, fmt::format("{} {} {} strided", c.name, dtype_name(d), shape));
      }
    }
  }
}

TEST_CASE("CUDA elementwise ops broadcast, take transposed and misaligned views", "[gpu]") {
  const Tensor a = random_tensor({64, 33}, kFloat32, 3, -2, 2);
  const Tensor row = random_tensor({33}, kFloat32, 4, -2, 2);
  const Tensor column = random_tensor({64, 1}, kFloat32, 5, -2, 2);
  const Tensor ga = a.to(kGpu), grow = row.to(kGpu), gcolumn = column.to(kGpu);
  check_close(add(ga, grow), add(a, row), "row broadcast");
  check_close(mul(gcolumn, ga), mul(column, a), "column broadcast");
  check_close(sub(gcolumn, grow), sub(column, row), "outer broadcast");
  check_close(where(gt(gcolumn, 0.0), ga, grow), where(gt(column, 0.0), a, row), "where broadcast");
  check_close(exp(ga.transpose(0, 1)), exp(a.transpose(0, 1)), "transposed");
  // One element in: a contiguous view whose data is not 16-byte aligned (no vector loads).
  const Tensor flat = random_tensor({4099}, kBFloat16, 6, -3, 3);
  const Tensor gflat = flat.to(kGpu);
  check_close(gelu(gflat.narrow(0, 1, 4097), GeluApproximation::kTanh),
              gelu(flat.narrow(0, 1, 4097), GeluApproximation::kTanh), "misaligned view");
  check_close(add(gflat.narrow(0, 1, 4097), gflat.narrow(0, 2, 4097)),
              add(flat.narrow(0, 1, 4097), flat.narrow(0, 2, 4097)), "two misaligned views");
}

TEST_CASE("CUDA in-place add_ and mul_ write through a view and leave the rest", "[gpu]") {
  Tensor a = random_tensor({16, 40}, kFloat32, 7, -2, 2);
  const Tensor b = random_tensor({40}, kFloat32, 8, -2, 2);
  Tensor ga = a.to(kGpu);
  Tensor view = ga.narrow(0, 2, 5);
  add_(view, b.to(kGpu), 0.5);
  Tensor cpu_view = a.narrow(0, 2, 5);
  add_(cpu_view, b, 0.5);
  check_close(ga, a, "add_ through a view");
  Tensor columns = ga.slice(1, 0, 40, 3);
  mul_(columns, -2.0);
  Tensor cpu_columns = a.slice(1, 0, 40, 3);
  mul_(cpu_columns, -2.0);
  check_close(ga, a, "mul_ through a strided view");
}

TEST_CASE("CUDA elementwise errors: devices, dtypes, too many dims", "[gpu]") {
  const Tensor a = zeros({2, 3}, kFloat32, kGpu);
  CHECK_THROWS_MATCHES(add(a, zeros({2, 3})), ValueError,
                       testing::MessageContains("add: operands on different devices: float32[2, 3]"));
  CHECK_THROWS_AS(exp(zeros({4}, kInt32, kGpu)), NotImplementedError);
  CHECK_THROWS_MATCHES(exp(zeros({1, 1, 1, 1, 1, 1, 1, 1, 2}, kFloat32, kGpu)), NotImplementedError,
                       testing::MessageContains("CUDA elementwise kernels take at most 8"));
}

}  // namespace
}  // namespace dtr
