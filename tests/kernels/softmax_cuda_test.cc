// The CUDA softmax kernels (kernels/cuda/softmax.h) against the CPU kernels on the same
// random inputs: softmax and log_softmax forward and backward along the last dim and along
// a leading one (moved last and back), in every floating dtype, at row lengths 1, 7, 1023,
// 4097 and an attention score's 128 x 128 per head; large logits (no overflow), a row of
// -inf but one. Tagged gpu (Bazel) and [gpu] (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <vector>

#include "kernels/softmax.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::random_tensor;
using testing::to_f64;

const Device kGpu(kCUDA, 0);

TEST_CASE("CUDA softmax and log_softmax, forward and backward, match the CPU", "[gpu]") {
  uint64_t seed = 1;
  for (DType d : testing::kFloatDTypes) {
    for (const Shape& shape : std::vector<Shape>{{3, 1}, {5, 7}, {4, 1023}, {2, 4097}, {2, 4, 128, 128}}) {
      for (int64_t dim : {int64_t{-1}, int64_t{0}}) {
        const Tensor x = random_tensor(shape, d, seed++, -6, 6), g = random_tensor(shape, d, seed++, -1, 1);
        const std::string what = fmt::format("{} {} dim {}", dtype_name(d), shape, dim);
        const Tensor y = softmax(x, dim), ly = log_softmax(x, dim);
        const Tensor gy = softmax(x.to(kGpu), dim), gly = log_softmax(x.to(kGpu), dim);
        check_close(gy, y, "softmax " + what);
        check_close(gly, ly, "log_softmax " + what);
        check_close(softmax_backward(g.to(kGpu), y.to(kGpu), dim), softmax_backward(g, y, dim),
                    "softmax_backward " + what);
        check_close(log_softmax_backward(g.to(kGpu), ly.to(kGpu), dim), log_softmax_backward(g, ly, dim),
                    "log_softmax_backward " + what);
      }
    }
  }
}

TEST_CASE("CUDA softmax of large logits and of a masked row", "[gpu]") {
  Tensor x = random_tensor({4, 300}, kFloat32, 7, 1000, 1010);  // exp would overflow without the max
  check_close(softmax(x.to(kGpu), -1), softmax(x, -1), "large logits");
  float* p = x.data_ptr<float>();
  for (int i = 0; i < 300; ++i) p[i] = i == 17 ? 0.0f : -std::numeric_limits<float>::infinity();
  const std::vector<double> row = to_f64(softmax(x.to(kGpu), -1));
  CHECK(row[17] == 1.0);
  CHECK(row[16] == 0.0);
  check_close(log_softmax(x.to(kGpu), -1), log_softmax(x, -1), "masked row");
}

}  // namespace
}  // namespace dtr
