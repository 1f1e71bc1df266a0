// The CUDA embedding kernels (kernels/cuda/embedding.h) against the CPU kernels: the
// forward in every dtype, the backward bitwise equal to the CPU's (the same summation
// order) in every floating dtype, with int32 and int64 indices of several shapes, many
// repeats of one index, padding_idx, no positions at all; an index out of range is an
// IndexError naming the range. Tagged gpu (Bazel) and [gpu] (Catch2): CPU-only runs leave it
// out.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fill.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::random_tensor;
using testing::to_f64;

const Device kGpu(kCUDA, 0);

TEST_CASE("CUDA embedding and its backward match the CPU bit for bit", "[gpu]") {
  uint64_t seed = 1;
  for (auto [rows, dim] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 33}, {4097, 256}}) {
    for (const Shape& index_shape : std::vector<Shape>{{0}, {1}, {7}, {8, 1024}}) {
      for (DType index_dtype : {kInt32, kInt64}) {
        const Tensor indices = random_tensor(index_shape, kInt64, seed++, 0, static_cast<double>(rows)).to(index_dtype);
        for (DType d : testing::kAllDTypes) {
          const Tensor weight = random_tensor({rows, dim}, d, seed++, -3, 3);
          const std::string what =
              fmt::format("{} [{}, {}] at {} {}", dtype_name(d), rows, dim, dtype_name(index_dtype), index_shape);
          INFO(what);
          CHECK(to_f64(embedding(weight.to(kGpu), indices.to(kGpu))) == to_f64(embedding(weight, indices)));
          if (!is_floating(d)) continue;
          Shape grad_shape = index_shape;
          grad_shape.push_back(dim);
          const Tensor grad = random_tensor(grad_shape, d, seed++, -1, 1);
          CHECK(to_f64(embedding_backward(grad.to(kGpu), indices.to(kGpu), rows)) ==
                to_f64(embedding_backward(grad, indices, rows)));
          CHECK(to_f64(embedding_backward(grad.to(kGpu), indices.to(kGpu), rows, 0)) ==
                to_f64(embedding_backward(grad, indices, rows, 0)));
        }
      }
    }
  }
}

TEST_CASE("CUDA embedding_backward with one index repeated everywhere, and bad indices", "[gpu]") {
  const Tensor same = full({4096}, 3.0, kInt64);
  const Tensor grad = random_tensor({4096, 64}, kFloat32, 5, -1, 1);
  CHECK(to_f64(embedding_backward(grad.to(kGpu), same.to(kGpu), 10)) == to_f64(embedding_backward(grad, same, 10)));
  const Tensor weight = zeros({5, 4}, kFloat32, kGpu);
  CHECK_THROWS_MATCHES(embedding(weight, full({3}, 5.0, kInt64, kGpu)), IndexError,
                       testing::MessageContains("every index must be in [0, 5) for 5 rows"));
  CHECK_THROWS_AS(embedding(weight, full({3}, -1.0, kInt32, kGpu)), IndexError);
}

}  // namespace
}  // namespace dtr
