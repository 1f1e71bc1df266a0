// Random tensors: values are a function of (seed, global index) only, so shards drawn with
// a layout equal slices of the whole draw, across dtypes, strides and thread counts; the
// distributions have the right moments; bad arguments raise typed errors.
#include "kernels/random.h"

#include <cmath>

#include "core/parallel.h"
#include "kernels/philox.h"
#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_equal;
using testing::to_f64;

// Draws with the three generators into a fresh tensor of shape/dtype (bernoulli p = 0.3).
enum class Generator { kUniform, kNormal, kBernoulli };
Tensor draw(Generator g, Shape shape, DType dtype, uint64_t seed, const std::optional<ShardLayout>& layout = {}) {
  switch (g) {
    case Generator::kUniform: {
      Tensor t = Tensor::empty(shape, dtype);
      return uniform_(t, -2.0, 3.0, seed, layout);
    }
    case Generator::kNormal: {
      Tensor t = Tensor::empty(shape, dtype);
      return normal_(t, 0.5, 2.0, seed, layout);
    }
    case Generator::kBernoulli: return bernoulli(shape, 0.3, seed, dtype, layout);
  }
  return {};
}

const Generator kGenerators[] = {Generator::kUniform, Generator::kNormal, Generator::kBernoulli};

TEST_CASE("a shard drawn with its layout equals the same block of the whole draw", "[random]") {
  for (Generator g : kGenerators) {
    for (DType dtype : testing::kFloatDTypes) {
      INFO("generator " << static_cast<int>(g) << ", dtype " << dtype_name(dtype));
      Tensor whole = draw(g, {8, 6}, dtype, 42);
      Tensor block = draw(g, {8, 3}, dtype, 42, ShardLayout{{8, 6}, {0, 2}});
      check_equal(block, whole.slice(1, 2, 5), "[0:8, 2:5] block");
      // Uneven torch.chunk shards of a [7, 5, 3] tensor along dim 0 (3, 3, 1 rows) and
      // a block offset in every dim.
      Tensor whole3 = draw(g, {7, 5, 3}, dtype, 7);
      for (int64_t start : {0, 3, 6}) {
        const int64_t rows = std::min<int64_t>(3, 7 - start);
        Tensor shard = draw(g, {rows, 5, 3}, dtype, 7, ShardLayout{{7, 5, 3}, {start, 0, 0}});
        check_equal(shard, whole3.narrow(0, start, rows), "chunk of dim 0");
      }
      Tensor inner = draw(g, {2, 3, 2}, dtype, 7, ShardLayout{{7, 5, 3}, {4, 1, 1}});
      check_equal(inner, whole3.narrow(0, 4, 2).narrow(1, 1, 3).narrow(2, 1, 2), "inner block");
      // Shards of whole rows are drawn as one run across rows, a column of width 1 too.
      Tensor column = draw(g, {9, 1}, dtype, 3);
      check_equal(draw(g, {4, 1}, dtype, 3, ShardLayout{{9, 1}, {5, 0}}), column.narrow(0, 5, 4),
                  "rows 5..8 of a [9, 1] column");
      // An empty shard (a rank past the end of an uneven split) draws nothing.
      CHECK(draw(g, {0, 6}, dtype, 42, ShardLayout{{8, 6}, {8, 0}}).numel() == 0);
    }
  }
}

TEST_CASE("values are the documented Philox draws at the global index, bit for bit", "[random]") {
  for (int64_t n : testing::kAwkwardSizes) {
    Tensor u = Tensor::empty({n}, kFloat64);
    uniform_(u, 0.0, 1.0, 99);
    Tensor z = Tensor::empty({n}, kFloat64);
    normal_(z, 0.0, 1.0, 99);
    Tensor b = bernoulli({n}, 0.5, 99, kInt64);
    std::vector<double> eu, ez, eb;
    for (int64_t i = 0; i < n; ++i) {
      eu.push_back(philox_uniform(99, static_cast<uint64_t>(i)));
      ez.push_back(philox_normal(99, static_cast<uint64_t>(i)));
      eb.push_back(philox_bernoulli(99, static_cast<uint64_t>(i), 0.5) ? 1.0 : 0.0);
    }
    check_equal(u, Shape{n}, eu, "uniform_ [0, 1)");
    check_equal(z, Shape{n}, ez, "normal_ (0, 1)");
    check_equal(b, Shape{n}, eb, "bernoulli 0.5");
  }
}

TEST_CASE("lower precision dtypes hold the float64 draw rounded once", "[random]") {
  for (Generator g : kGenerators) {
    Tensor ref = draw(g, {1023}, kFloat64, 5);
    for (DType dtype : {kFloat32, kBFloat16, kFloat16}) {
      INFO("dtype " << dtype_name(dtype));
      check_equal(draw(g, {1023}, dtype, 5), ref.to(dtype), "rounded draw");
    }
  }
}

TEST_CASE("non-contiguous destinations get the values of their own positions", "[random]") {
  for (DType dtype : testing::kFloatDTypes) {
    Tensor expected = draw(Generator::kNormal, {5, 7}, dtype, 3);
    Tensor buffer = zeros({7, 10}, dtype);
    Tensor view = buffer.narrow(1, 1, 5).t();  // [5, 7], strides [1, 10]
    normal_(view, 0.5, 2.0, 3);
    check_equal(view, expected, "transposed view");
    // Elements outside the view stay untouched.
    check_equal(buffer.narrow(1, 0, 1), Shape{7, 1}, std::vector<double>(7, 0.0), "column before the view");
    check_equal(buffer.narrow(1, 6, 4), Shape{7, 4}, std::vector<double>(28, 0.0), "columns after the view");
  }
}

TEST_CASE("draws do not depend on the thread count", "[random][parallel]") {
  testing::ThreadCountGuard guard;
  for (Generator g : kGenerators) {
    set_num_threads(1);
    Tensor one = draw(g, {4097, 9}, kFloat32, 11);
    set_num_threads(2);
    Tensor two = draw(g, {4097, 9}, kFloat32, 11);
    check_equal(two, one, "2 threads vs 1");
  }
}

TEST_CASE("different seeds give different draws", "[random]") {
  for (Generator g : kGenerators) {
    std::vector<double> a = to_f64(draw(g, {1000}, kFloat64, 1));
    std::vector<double> b = to_f64(draw(g, {1000}, kFloat64, 2));
    int64_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
    // Bernoulli(0.3) agrees on 0.58 of elements by chance; continuous draws essentially never.
    CHECK(same < (g == Generator::kBernoulli ? 650 : 1));
  }
}

// Sample moments of 1e5 draws lie within 5 standard errors of the true ones.
TEST_CASE("uniform, normal and bernoulli have the right moments", "[random][statistics]") {
  const int64_t n = 100000;
  auto moments = [](const std::vector<double>& v) {
    double mean = 0.0, var = 0.0;
    for (double x : v) mean += x;
    mean /= static_cast<double>(v.size());
    for (double x : v) var += (x - mean) * (x - mean);
    return std::pair{mean, std::sqrt(var / static_cast<double>(v.size() - 1))};
  };
  const double root_n = std::sqrt(static_cast<double>(n));

  Tensor u = Tensor::empty({n}, kFloat64);
  std::vector<double> uv = to_f64(uniform_(u, -2.0, 3.0, 17));
  auto [u_mean, u_std] = moments(uv);
  CHECK(*std::min_element(uv.begin(), uv.end()) >= -2.0);
  CHECK(*std::max_element(uv.begin(), uv.end()) < 3.0);
  const double u_sigma = 5.0 / std::sqrt(12.0);
  CHECK(std::abs(u_mean - 0.5) < 5.0 * u_sigma / root_n);
  // The uniform's kurtosis is below the normal's, so the normal's standard error of s bounds it.
  CHECK(std::abs(u_std - u_sigma) < 5.0 * u_sigma / std::sqrt(2.0 * n));

  Tensor z = Tensor::empty({n}, kFloat64);
  std::vector<double> zv = to_f64(normal_(z, 0.5, 2.0, 17));
  auto [z_mean, z_std] = moments(zv);
  CHECK(std::abs(z_mean - 0.5) < 5.0 * 2.0 / root_n);
  CHECK(std::abs(z_std - 2.0) < 5.0 * 2.0 / std::sqrt(2.0 * n));
  int64_t within_one_sigma = 0;
  for (double x : zv) within_one_sigma += std::abs(x - 0.5) < 2.0;
  const double p1 = 0.6826894921370859;
  CHECK(std::abs(static_cast<double>(within_one_sigma) / n - p1) < 5.0 * std::sqrt(p1 * (1 - p1) / n));

  std::vector<double> bv = to_f64(bernoulli({n}, 0.3, 17, kBool));
  auto [b_mean, b_std] = moments(bv);
  CHECK(std::abs(b_mean - 0.3) < 5.0 * std::sqrt(0.3 * 0.7 / n));
}

TEST_CASE("bernoulli with p = 0 and p = 1 is exact in every dtype", "[random]") {
  for (DType dtype : testing::kAllDTypes) {
    check_equal(bernoulli({7, 3}, 0.0, 5, dtype), Shape{7, 3}, std::vector<double>(21, 0.0), "p = 0");
    check_equal(bernoulli({7, 3}, 1.0, 5, dtype), Shape{7, 3}, std::vector<double>(21, 1.0), "p = 1");
  }
}

TEST_CASE("random ops reject bad arguments with typed errors", "[random][errors]") {
  Tensor t = Tensor::empty({8, 3});
  CHECK_THROWS_AS(uniform_(t, 1.0, 0.0, 1), ValueError);
  CHECK_THROWS_WITH(uniform_(t, 1.0, 0.0, 1), Catch::Contains("uniform_") && Catch::Contains("lo <= hi"));
  CHECK_THROWS_AS(normal_(t, 0.0, -1.0, 1), ValueError);
  CHECK_THROWS_WITH(bernoulli({2}, 1.5, 1), Catch::Contains("bernoulli") && Catch::Contains("[0, 1]"));
  Tensor ints = Tensor::empty({4}, kInt32);
  CHECK_THROWS_AS(uniform_(ints, 0.0, 1.0, 1), TypeError);
  CHECK_THROWS_WITH(normal_(ints, 0.0, 1.0, 1), Catch::Contains("normal_") && Catch::Contains("int32[4]"));
  // Layouts that do not hold the tensor.
  CHECK_THROWS_WITH(uniform_(t, 0.0, 1.0, 1, ShardLayout{{8, 6}, {0, 4}}),
                    Catch::Contains("uniform_") && Catch::Contains("float32[8, 3]") && Catch::Contains("[8, 6]"));
  CHECK_THROWS_AS(uniform_(t, 0.0, 1.0, 1, ShardLayout{{8, 6}, {-1, 0}}), ValueError);
  CHECK_THROWS_AS(uniform_(t, 0.0, 1.0, 1, ShardLayout{{8, 3, 1}, {0, 0, 0}}), ValueError);
  // An expanded view would write one element many times.
  Tensor row = Tensor::empty({1, 3});
  Tensor expanded = row.expand({4, 3});
  CHECK_THROWS_WITH(normal_(expanded, 0.0, 1.0, 1), Catch::Contains("expanded"));
}

}  // namespace
}  // namespace dtr
