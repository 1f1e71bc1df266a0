// On a machine with a GPU: elementwise ops and reductions on CUDA tensors raise
// NotImplementedError naming the op and the device, until their CUDA kernels land.
// Tagged gpu (Bazel) and [gpu] (Catch2): CPU-only runs leave it out.
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "kernels/reduce.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

TEST_CASE("ops on CUDA tensors raise NotImplementedError naming the op and device", "[gpu]") {
  const Tensor a = zeros({2, 3}, kFloat32, Device(kCUDA, 0));
  const auto names = [](std::string_view op) { return Catch::Contains(std::string(op)) && Catch::Contains("cuda:0"); };
  CHECK_THROWS_AS(add(a, a), NotImplementedError);
  CHECK_THROWS_WITH(add(a, a), names("add"));
  CHECK_THROWS_WITH(relu(a), names("relu"));
  CHECK_THROWS_WITH(gt(a, 0.0), names("gt"));
  CHECK_THROWS_WITH(sum(a, {0}), names("sum"));
  CHECK_THROWS_WITH(argmax(a, 1), names("argmax"));
  Tensor b = zeros({2, 3}, kFloat32, Device(kCUDA, 0));
  CHECK_THROWS_WITH(add_(b, a), names("add_"));
  CHECK_THROWS_WITH(add(a, zeros({2, 3})), Catch::Contains("add") && Catch::Contains("different devices"));
}

}  // namespace
}  // namespace dtr
