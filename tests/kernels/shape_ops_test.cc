// cat, split, chunk: values against index arithmetic in float64, views sharing storage,
// torch.chunk's sizes (and the padded variant DTensor's Shard uses), typed errors.
#include <omp.h>

#include "kernels/fill.h"
#include "kernels/shape_ops.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_equal;
using testing::random_tensor;
using testing::strided_copy;
using testing::to_f64;

// cat written as plain loops: for each index of the dims before `dim`, every input's
// rows along dim in turn, each row holding the elements of the dims after it (float64, of
// the inputs' shape with their sizes along dim added up).
Tensor cat_reference(const std::vector<Tensor>& tensors, int64_t dim) {
  const Shape& s = tensors[0].shape();
  Shape shape = s;
  shape[dim] = 0;
  for (const Tensor& t : tensors) shape[dim] += t.size(dim);
  const int64_t outer = shape_numel(std::span(s).first(dim));
  const int64_t inner = shape_numel(std::span(s).subspan(dim + 1));
  std::vector<std::vector<double>> values;
  for (const Tensor& t : tensors) values.push_back(to_f64(t));
  std::vector<double> out;
  for (int64_t o = 0; o < outer; ++o) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int64_t rows = tensors[i].size(dim);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < inner; ++k) out.push_back(values[i][(o * rows + r) * inner + k]);
      }
    }
  }
  return Tensor::from_vector(out, shape);
}

std::vector<int64_t> sizes_along(const std::vector<Tensor>& views, int64_t dim) {
  std::vector<int64_t> sizes;
  for (const Tensor& v : views) sizes.push_back(v.size(dim));
  return sizes;
}

TEST_CASE("cat along each dim matches index arithmetic for every dtype and awkward size", "[cat]") {
  uint64_t seed = 1;
  for (DType dtype : testing::kAllDTypes) {
    for (int64_t n : testing::kAwkwardSizes) {
      // Along dim 0, dim 1 and the middle of three dims; one piece has size n along dim.
      std::vector<Tensor> rows = {random_tensor({n, 3}, dtype, seed++), random_tensor({2, 3}, dtype, seed++)};
      Tensor c0 = cat(rows, 0);
      CHECK(c0.shape() == Shape{n + 2, 3});
      CHECK(c0.is_contiguous());
      check_equal(c0, cat_reference(rows, 0), fmt::format("cat dim 0, n={}", n));

      std::vector<Tensor> cols = {random_tensor({3, 1}, dtype, seed++), random_tensor({3, n}, dtype, seed++),
                                  random_tensor({3, 2}, dtype, seed++)};
      check_equal(cat(cols, -1), cat_reference(cols, 1), fmt::format("cat dim -1, n={}", n));

      std::vector<Tensor> mid = {random_tensor({2, n, 5}, dtype, seed++), random_tensor({2, 0, 5}, dtype, seed++),
                                 random_tensor({2, 7, 5}, dtype, seed++)};
      check_equal(cat(mid, 1), cat_reference(mid, 1), fmt::format("cat dim 1 of 3, n={}", n));
    }
  }
}

TEST_CASE("cat of non-contiguous inputs, alone and mixed with contiguous ones", "[cat]") {
  for (DType dtype : testing::kAllDTypes) {
    for (int64_t n : testing::kAwkwardSizes) {
      Tensor a = strided_copy(random_tensor({n, 4}, dtype, 10));
      Tensor b = random_tensor({4, 3}, dtype, 11).t();  // transposed: [3, 4]
      Tensor c = random_tensor({2, 4}, dtype, 12);
      REQUIRE_FALSE(b.is_contiguous());
      std::vector<Tensor> parts = {a, b, c};
      check_equal(cat(parts, 0), cat_reference(parts, 0), fmt::format("strided cat dim 0, n={}", n));
      std::vector<Tensor> cols = {b.t(), c.t(), a.t()};  // [4, 3], [4, 2], [4, n]
      check_equal(cat(cols, 1), cat_reference(cols, 1), fmt::format("strided cat dim 1, n={}", n));
    }
  }
}

TEST_CASE("cat is the same on one thread and on many, across the parallel threshold", "[cat]") {
  // 4097 x 96 float32 = 1.5 MiB: above the size where cat splits its work across threads,
  // and cut so that work items straddle input blocks and output rows.
  std::vector<Tensor> parts = {random_tensor({4097, 33}, kFloat32, 20), random_tensor({4097, 1}, kFloat32, 21),
                               strided_copy(random_tensor({4097, 62}, kFloat32, 22))};
  const Tensor expected = cat_reference(parts, 1);
  const int threads = omp_get_max_threads();
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    check_equal(cat(parts, 1), expected, fmt::format("cat with {} threads", t));
  }
  omp_set_num_threads(threads);
  std::vector<Tensor> tall = {random_tensor({4097, 128}, kFloat64, 23), random_tensor({1023, 128}, kFloat64, 24)};
  check_equal(cat(tall, 0), cat_reference(tall, 0), "cat dim 0, 5 MiB");
}

TEST_CASE("cat of an output larger than the caches (streamed) writes every byte, on any thread count", "[cat]") {
  // Rows of 256 elements (1 KiB of float32, 512 B of bfloat16) cut into pieces of 33, 1 and
  // 222 elements: most pieces start and end inside a cache line, where the streamed copy
  // stores plainly. 8193 x 256 float32 and 16385 x 256 bfloat16 are just over 8 MiB.
  for (const auto& [dtype, rows] : {std::pair{kFloat32, int64_t{8193}}, std::pair{kBFloat16, int64_t{16385}}}) {
    std::vector<Tensor> parts = {random_tensor({rows, 33}, dtype, 30), random_tensor({rows, 1}, dtype, 31),
                                 strided_copy(random_tensor({rows, 222}, dtype, 32))};
    const Tensor expected = cat_reference(parts, 1);
    const int threads = omp_get_max_threads();
    for (int t : {1, 2}) {
      omp_set_num_threads(t);
      check_equal(cat(parts, 1), expected, fmt::format("{} cat of {} rows with {} threads", dtype, rows, t));
    }
    omp_set_num_threads(threads);
  }
}

TEST_CASE("cat of the pieces of arange gives arange back, bit for bit", "[cat]") {
  Tensor x = arange(0.0, 60.0, 1.0, kFloat32).view({3, 4, 5});
  for (int64_t dim = 0; dim < 3; ++dim) {
    Tensor joined = cat(chunk(x, 2, dim), dim);
    check_equal(joined, x, fmt::format("cat(chunk(x, 2, {}))", dim));
  }
}

TEST_CASE("cat_out writes into a preallocated contiguous tensor", "[cat]") {
  std::vector<Tensor> parts = {full({2, 3}, 1.0), full({1, 3}, 2.0)};
  Tensor out = Tensor::empty({3, 3});
  Tensor& same = cat_out(out, parts, 0);
  CHECK(&same == &out);
  check_equal(out, Shape{3, 3}, {1, 1, 1, 1, 1, 1, 2, 2, 2}, "cat_out");
  Tensor wrong = Tensor::empty({3, 4});
  CHECK_THROWS_AS(cat_out(wrong, parts, 0), ValueError);
  CHECK_THROWS_WITH(cat_out(wrong, parts, 0), Catch::Contains("float32[3, 4]") && Catch::Contains("float32[3, 3]"));
  Tensor strided = Tensor::empty({3, 6}).slice(1, 0, 6, 2);
  CHECK_THROWS_WITH(cat_out(strided, parts, 0), Catch::Contains("not contiguous"));
}

TEST_CASE("cat rejects mismatched inputs with typed errors that name them", "[cat][errors]") {
  CHECK_THROWS_AS(cat({}, 0), ValueError);
  CHECK_THROWS_WITH(cat({}, 0), Catch::Contains("non-empty"));
  CHECK_THROWS_AS(cat({zeros({2, 3}), zeros({2, 3}, kBFloat16)}, 0), TypeError);
  CHECK_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 3}, kBFloat16)}, 0),
                    Catch::Contains("tensor 1 is bfloat16[2, 3]") && Catch::Contains("same dtype"));
  CHECK_THROWS_AS(cat({zeros({2, 3}), zeros({2, 4})}, 0), ValueError);
  CHECK_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 4})}, 0), Catch::Contains("float32[2, 4]") &&
                                                                Catch::Contains("except in dim 0") &&
                                                                Catch::Contains("dim 1 differs"));
  CHECK_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 3, 1})}, 0), Catch::Contains("same number of dims"));
  CHECK_THROWS_WITH(cat({zeros({})}, 0), Catch::Contains("0-d"));
  CHECK_THROWS_AS(cat({zeros({2, 3})}, 2), IndexError);
  CHECK_THROWS_WITH(cat({zeros({2, 3})}, 2), Catch::Contains("cat") && Catch::Contains("[-2, 1]"));
}

TEST_CASE("split by size returns views; the last may be smaller", "[split]") {
  Tensor x = arange(0.0, 14.0, 1.0, kFloat64).view({7, 2});
  std::vector<Tensor> parts = split(x, 3);
  REQUIRE(parts.size() == 3);
  CHECK(sizes_along(parts, 0) == std::vector<int64_t>{3, 3, 1});
  for (const Tensor& p : parts) CHECK(p.storage().is_same(x.storage()));
  check_equal(parts[1], Shape{3, 2}, {6, 7, 8, 9, 10, 11}, "split(x, 3)[1]");
  check_equal(parts[2], Shape{1, 2}, {12, 13}, "split(x, 3)[2]");
  CHECK(sizes_along(split(x, 2, 1), 1) == std::vector<int64_t>{2});
  CHECK(sizes_along(split(x, 7), 0) == std::vector<int64_t>{7});
  CHECK(sizes_along(split(x, 100), 0) == std::vector<int64_t>{7});
  // A size-0 dim gives one empty view, even for split_size 0.
  CHECK(split(zeros({0, 2}), 3).size() == 1);
  CHECK(split(zeros({0, 2}), 0).size() == 1);
  CHECK_THROWS_AS(split(x, 0), ValueError);
  CHECK_THROWS_WITH(split(x, -1), Catch::Contains("split_size -1") && Catch::Contains("float64[7, 2]"));
  CHECK_THROWS_WITH(split(zeros({}), 1), Catch::Contains("0-d"));
}

TEST_CASE("split by sizes cuts exactly there, on strided inputs too", "[split]") {
  for (DType dtype : testing::kAllDTypes) {
    Tensor x = strided_copy(random_tensor({4, 7}, dtype, 30));
    std::vector<Tensor> parts = split(x, {2, 0, 5}, 1);
    REQUIRE(parts.size() == 3);
    CHECK(sizes_along(parts, 1) == std::vector<int64_t>{2, 0, 5});
    const std::vector<double> v = to_f64(x);
    std::vector<double> expected;
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 2; c < 7; ++c) expected.push_back(v[r * 7 + c]);
    check_equal(parts[2], Shape{4, 5}, expected, "split(x, {2, 0, 5}, 1)[2]");
    check_equal(cat(parts, 1), x.shape(), v, "cat(split(x))");
  }
  Tensor x = zeros({7});
  CHECK(split(x, {7}).size() == 1);  // a braced list is always sizes, as in torch.split(x, [7])
  const std::vector<int64_t> short_sizes = {3, 3};
  CHECK_THROWS_AS(split(x, short_sizes), ValueError);
  CHECK_THROWS_WITH(split(x, short_sizes), Catch::Contains("[3, 3]") && Catch::Contains("sum to 7"));
  CHECK_THROWS_WITH(split(x, {8, -1}), Catch::Contains("non-negative"));
  CHECK_THROWS_WITH(split(x, {3}), Catch::Contains("sum to 7"));
}

TEST_CASE("chunk follows torch.chunk; chunk_padded always returns k views", "[chunk]") {
  struct Case {
    int64_t n, k;
    std::vector<int64_t> chunk, padded;
  };
  const Case cases[] = {
      {5, 2, {3, 2}, {3, 2}},
      {6, 4, {2, 2, 2}, {2, 2, 2, 0}},
      {11, 6, {2, 2, 2, 2, 2, 1}, {2, 2, 2, 2, 2, 1}},  // torch.chunk's documented examples
      {12, 6, {2, 2, 2, 2, 2, 2}, {2, 2, 2, 2, 2, 2}},
      {13, 6, {3, 3, 3, 3, 1}, {3, 3, 3, 3, 1, 0}},
      {1, 4, {1}, {1, 0, 0, 0}},
      {0, 3, {0, 0, 0}, {0, 0, 0}},
  };
  for (const Case& c : cases) {
    Tensor x = zeros({2, c.n});
    INFO("n=" << c.n << " k=" << c.k);
    CHECK(sizes_along(chunk(x, c.k, 1), 1) == c.chunk);
    CHECK(sizes_along(chunk_padded(x, c.k, 1), 1) == c.padded);
    CHECK(chunk_sizes(c.n, c.k) == c.padded);
  }
  CHECK_THROWS_AS(chunk(zeros({4}), 0), ValueError);
  CHECK_THROWS_WITH(chunk_padded(zeros({4}), -2), Catch::Contains("chunks must be positive, got -2"));
  CHECK_THROWS_AS(chunk(zeros({4}), 2, 1), IndexError);
}

TEST_CASE("chunk_padded views tile the input: rank r holds rows [r*c, r*c + size_r)", "[chunk]") {
  for (DType dtype : testing::kAllDTypes) {
    for (int64_t n : testing::kAwkwardSizes) {
      for (int64_t k : {1, 2, 3, 4, 8}) {
        Tensor x = strided_copy(random_tensor({n, 3}, dtype, static_cast<uint64_t>(n * 10 + k)));
        std::vector<Tensor> shards = chunk_padded(x, k, 0);
        REQUIRE(static_cast<int64_t>(shards.size()) == k);
        const int64_t c = (n + k - 1) / k;
        const std::vector<double> v = to_f64(x);
        for (int64_t r = 0; r < k; ++r) {
          const int64_t begin = std::min(n, r * c), end = std::min(n, (r + 1) * c);
          CHECK(shards[r].size(0) == end - begin);
          CHECK(shards[r].storage().is_same(x.storage()));
          check_equal(shards[r], Shape{end - begin, 3}, std::vector<double>(v.begin() + begin * 3, v.begin() + end * 3),
                      fmt::format("shard {} of {}, n={}", r, k, n));
        }
        check_equal(cat(shards, 0), x.shape(), v, fmt::format("cat(chunk_padded(x, {})), n={}", k, n));
      }
    }
  }
}

}  // namespace
}  // namespace dtr
