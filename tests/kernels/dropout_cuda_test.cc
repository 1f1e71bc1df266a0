// CUDA dropout (kernels/cuda/dropout.h and the CUDA bernoulli under it) against the CPU's:
// for the same seed the mask, the output and the backward's gradient are bitwise the CPU's,
// in every floating dtype, at p = 0, 0.1, 0.5 and 1, sizes 1, 7, 1023, 4097 and
// [8, 128, 256], strided inputs, and a ShardLayout shard whose mask is the slice of the
// whole tensor's. Tagged gpu (Bazel) and [gpu] (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "kernels/dropout.h"
#include "kernels/fill.h"
#include "tests/kernels/check_bitwise.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_bitwise;
using testing::random_tensor;

const Device kGpu(kCUDA, 0);

TEST_CASE("CUDA dropout and its backward equal the CPU's bit for bit", "[gpu]") {
  uint64_t seed = 1;
  for (const Shape& shape : std::vector<Shape>{{1}, {7}, {1023}, {4097}, {8, 128, 256}}) {
    for (DType d : testing::kFloatDTypes) {
      for (double p : {0.0, 0.1, 0.5, 1.0}) {
        const std::string what = fmt::format("dropout p = {} of {}{}", p, dtype_name(d), shape);
        INFO(what);
        const Tensor x = random_tensor(shape, d, seed++, -4, 4), grad_y = random_tensor(shape, d, seed++, -1, 1);
        const DropoutOutput c = dropout(x, p, 0xfeedface12345678ull);
        const DropoutOutput g = dropout(x.to(kGpu), p, 0xfeedface12345678ull);
        REQUIRE(g.y.device() == kGpu);
        REQUIRE(g.mask.device() == kGpu);
        check_bitwise(g.mask, c.mask, "mask of " + what);
        check_bitwise(g.y, c.y, "y of " + what);
        check_bitwise(dropout_backward(grad_y.to(kGpu), g.mask, p), dropout_backward(grad_y, c.mask, p),
                      "grad_x of " + what);
        // A strided input and gradient: the same values, the same results.
        const Tensor xs = testing::strided_copy(x.to(kGpu)), gs = testing::strided_copy(grad_y.to(kGpu));
        const DropoutOutput s = dropout(xs, p, 0xfeedface12345678ull);
        check_bitwise(s.mask, c.mask, "mask of strided " + what);
        check_bitwise(s.y, c.y, "y of strided " + what);
        check_bitwise(dropout_backward(gs, s.mask, p), dropout_backward(grad_y, c.mask, p),
                      "grad_x of strided " + what);
      }
    }
  }
}

TEST_CASE("CUDA dropout of a shard drops what the whole tensor drops there", "[gpu]") {
  for (DType d : testing::kFloatDTypes) {
    INFO(dtype_name(d));
    const Tensor x = random_tensor({64, 33}, d, 9).to(kGpu);
    const DropoutOutput whole = dropout(x, 0.25, 77);
    const Tensor shard = x.narrow(1, 11, 11).contiguous();
    const DropoutOutput part = dropout(shard, 0.25, 77, ShardLayout{{64, 33}, {0, 11}});
    check_bitwise(part.mask, whole.mask.narrow(1, 11, 11), "mask of columns 11..21");
    check_bitwise(part.y, whole.y.narrow(1, 11, 11), "y of columns 11..21");
    const DropoutOutput cpu_part = dropout(shard.to(kCPU), 0.25, 77, ShardLayout{{64, 33}, {0, 11}});
    check_bitwise(part.y, cpu_part.y, "y of columns 11..21 vs the CPU's");
  }
}

}  // namespace
}  // namespace dtr
