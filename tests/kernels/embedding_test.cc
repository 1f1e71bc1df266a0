// embedding and embedding_backward against loops written here: every dtype for the lookup
// and every floating dtype for the gradient, embedding dims 0/1/7/1023/4097, int32 and
// int64 indices of several shapes, strided weights, grads and indices; exact counts;
// padding_idx; bitwise equality on 1 and 2 threads; IndexError naming index, position, V.
#include "kernels/embedding.h"

#include <random>

#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::to_f64;

// Random indices in [0, v) of the given shape and dtype.
Tensor random_indices(Shape shape, int64_t v, DType dtype, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, v - 1);
  std::vector<int64_t> values(static_cast<size_t>(shape_numel(shape)));
  for (int64_t& x : values) x = dist(gen);
  return Tensor::from_vector(values, shape).to(dtype);
}

std::vector<int64_t> index_values(const Tensor& indices) {
  std::vector<int64_t> out;
  for (double v : to_f64(indices)) out.push_back(static_cast<int64_t>(v));
  return out;
}

// out[p][i] = weight[idx[p]][i].
std::vector<double> reference_embedding(const std::vector<double>& weight, int64_t d, const std::vector<int64_t>& idx) {
  std::vector<double> out;
  for (int64_t v : idx)
    for (int64_t i = 0; i < d; ++i) out.push_back(weight[v * d + i]);
  return out;
}

// out[v][i] = sum over positions p with idx[p] == v (v != padding) of grad[p][i], in float64.
std::vector<double> reference_backward(const std::vector<double>& grad, int64_t d, const std::vector<int64_t>& idx,
                                       int64_t v, int64_t padding) {
  std::vector<double> out(static_cast<size_t>(v * d), 0.0);
  for (size_t p = 0; p < idx.size(); ++p) {
    if (idx[p] == padding) continue;
    for (int64_t i = 0; i < d; ++i) out[idx[p] * d + i] += grad[p * d + i];
  }
  return out;
}

const Shape kIndexShapes[] = {{0}, {5}, {3, 4}, {2, 1, 3}};

TEST_CASE("embedding gathers rows exactly for every dtype, index dtype and layout", "[embedding]") {
  uint64_t seed = 1;
  for (DType dtype : testing::kAllDTypes) {
    for (int64_t d : testing::kAwkwardSizes) {
      const int64_t v = d == 4097 ? 3 : 11;
      Tensor weight = testing::random_tensor({v, d}, dtype, seed++, -50.0, 50.0);
      for (DType index_dtype : {kInt32, kInt64}) {
        for (const Shape& shape : kIndexShapes) {
          Tensor indices = random_indices(shape, v, index_dtype, seed++);
          const std::vector<double> expected = reference_embedding(to_f64(weight), d, index_values(indices));
          Shape out_shape = shape;
          out_shape.push_back(d);
          const std::string what = fmt::format("embedding {} at {}", describe(weight), describe(indices));
          Tensor out = embedding(weight, indices);
          CHECK(out.shape() == out_shape);
          CHECK(out.dtype() == dtype);
          testing::check_equal(out, out_shape, expected, what);
          testing::check_equal(embedding(testing::strided_copy(weight), testing::strided_copy(indices)), out_shape,
                               expected, what + ", strided");
          // A transposed table: weight = table.t() has strides [1, v].
          testing::check_equal(embedding(weight.t().contiguous().t(), indices), out_shape, expected,
                               what + ", transposed");
        }
      }
    }
  }
}

TEST_CASE("embedding_backward sums gradient rows per index like a float64 loop", "[embedding][backward]") {
  uint64_t seed = 100;
  for (DType dtype : testing::kFloatDTypes) {
    for (int64_t d : testing::kAwkwardSizes) {
      for (int64_t v : {1, 7, 1023}) {
        // Many positions per row for small v: the sums get long.
        Tensor indices = random_indices({d == 4097 ? 37 : 301}, v, kInt64, seed++);
        Tensor grad = testing::random_tensor({indices.size(0), d}, dtype, seed++);
        const std::vector<int64_t> idx = index_values(indices);
        const std::string what = fmt::format("embedding_backward {} into {} rows", describe(grad), v);
        testing::Tolerance tol = testing::tolerance_for(dtype);
        tol.atol *= std::sqrt(301.0 / v + 1.0);
        for (std::optional<int64_t> padding : {std::optional<int64_t>(), std::optional<int64_t>(0)}) {
          const std::vector<double> expected = reference_backward(to_f64(grad), d, idx, v, padding.value_or(-1));
          Tensor out = embedding_backward(grad, indices, v, padding);
          CHECK(out.shape() == Shape{v, d});
          CHECK(out.dtype() == dtype);
          testing::check_close(out, Shape{v, d}, expected, tol, what);
          testing::check_close(embedding_backward(testing::strided_copy(grad), indices.to(kInt32), v, padding),
                               Shape{v, d}, expected, tol, what + ", strided grad, int32 indices");
        }
      }
    }
  }
  // Indices of several dims: grad carries their shape.
  Tensor indices = random_indices({3, 4}, 5, kInt32, 7);
  Tensor grad = testing::random_tensor({3, 4, 6}, kFloat32, 8);
  testing::check_close(embedding_backward(grad, indices, 5), Shape{5, 6},
                       reference_backward(to_f64(grad), 6, index_values(indices), 5, -1), "2-D indices");
}

// A gradient table beyond the caches (8 MiB and more) is streamed out row by row
// (row_store.h): every row, touched or not, must still hold its sum, in 1 and 2 threads.
TEST_CASE("embedding_backward into a table beyond the caches (streamed) matches the loop", "[embedding][backward]") {
  testing::ThreadCountGuard guard;
  uint64_t seed = 300;
  for (auto [dtype, v] : {std::pair<DType, int64_t>{kFloat32, 2100}, std::pair<DType, int64_t>{kBFloat16, 4200}}) {
    const int64_t d = 1024;
    Tensor indices = random_indices({301}, v, kInt64, seed++);
    Tensor grad = testing::random_tensor({indices.size(0), d}, dtype, seed++);
    const std::vector<double> expected = reference_backward(to_f64(grad), d, index_values(indices), v, -1);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor out = embedding_backward(grad, indices, v);
      REQUIRE(out.nbytes() >= (size_t{8} << 20));
      testing::check_close(out, Shape{v, d}, expected, testing::tolerance_for(dtype),
                           fmt::format("embedding_backward {} into {} rows on {} threads", describe(grad), v, threads));
    }
  }
}

TEST_CASE("embedding_backward of ones counts positions exactly; padding_idx rows stay zero", "[embedding][exact]") {
  const std::vector<int64_t> idx{2, 0, 2, 3, 2, 0, 4};
  Tensor indices = Tensor::from_vector(idx);
  for (DType dtype : testing::kFloatDTypes) {
    Tensor grad = ones({7, 3}, dtype);
    testing::check_equal(embedding_backward(grad, indices, 6), Shape{6, 3},
                         {2, 2, 2, 0, 0, 0, 3, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0, 0}, "counts");
    testing::check_equal(embedding_backward(grad, indices, 6, 2), Shape{6, 3},
                         {2, 2, 2, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0}, "padding_idx 2");
    testing::check_equal(embedding_backward(grad, indices, 5, -1), Shape{5, 3},
                         {2, 2, 2, 0, 0, 0, 3, 3, 3, 1, 1, 1, 0, 0, 0}, "padding_idx -1 is row 4");
  }
}

TEST_CASE("embedding_backward is bitwise the same on 1 and 2 threads", "[embedding][parallel]") {
  testing::ThreadCountGuard guard;
  for (DType dtype : testing::kFloatDTypes) {
    Tensor indices = random_indices({4097}, 37, kInt64, 3);
    Tensor grad = testing::random_tensor({4097, 65}, dtype, 4);
    set_num_threads(1);
    Tensor one = embedding_backward(grad, indices, 37);
    set_num_threads(2);
    Tensor two = embedding_backward(grad, indices, 37);
    testing::check_equal(two, one, fmt::format("{} threads 2 vs 1", dtype_name(dtype)));
  }
}

TEST_CASE("embedding rejects bad indices and shapes with typed errors", "[embedding][errors]") {
  Tensor weight = Tensor::empty({10, 4});
  Tensor indices = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 12, 0, 1}, {2, 3});
  CHECK_THROWS_AS(embedding(weight, indices), IndexError);
  CHECK_THROWS_WITH(embedding(weight, indices), Catch::Contains("embedding") && Catch::Contains("index 12") &&
                                                    Catch::Contains("position [1, 0]") && Catch::Contains("10 rows"));
  CHECK_THROWS_WITH(embedding(weight, Tensor::from_vector(std::vector<int32_t>{-1})), Catch::Contains("index -1"));
  CHECK_THROWS_AS(embedding(weight, Tensor::empty({3}, kFloat32)), TypeError);
  CHECK_THROWS_WITH(embedding(Tensor::empty({10}), indices), Catch::Contains("2-D") && Catch::Contains("float32[10]"));
  Tensor grad = Tensor::empty({2, 3, 4});
  CHECK_THROWS_WITH(embedding_backward(grad, indices, 10),
                    Catch::Contains("embedding_backward") && Catch::Contains("index 12") && Catch::Contains("10 rows"));
  CHECK_THROWS_AS(embedding_backward(Tensor::empty({3, 4}), indices, 20), ValueError);
  CHECK_THROWS_AS(embedding_backward(Tensor::empty({2, 3, 4}, kInt64), indices, 20), TypeError);
  CHECK_THROWS_WITH(embedding_backward(grad, indices, 20, 20), Catch::Contains("padding_idx 20"));
  CHECK_THROWS_AS(embedding_backward(grad, indices, 20, -21), ValueError);
}

}  // namespace
}  // namespace dtr
