// On a machine with a GPU: an elementwise op on a CUDA and a CPU tensor raises, naming the
// op and the different devices. Tagged gpu (Bazel) and [gpu] (Catch2): CPU-only runs leave
// it out.
#include <catch2/catch.hpp>

#include "kernels/elementwise.h"
#include "kernels/error.h"
#include "kernels/fill.h"

namespace dtr {
namespace {

TEST_CASE("an elementwise op on tensors of different devices raises naming the op and the devices", "[gpu]") {
  const Tensor a = zeros({2, 3}, kFloat32, Device(kCUDA, 0));
  CHECK_THROWS_AS(add(a, zeros({2, 3})), ValueError);
  CHECK_THROWS_WITH(add(a, zeros({2, 3})),
                    Catch::Contains("add") && Catch::Contains("different devices") && Catch::Contains("cuda:0"));
}

}  // namespace
}  // namespace dtr
