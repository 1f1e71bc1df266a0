// index_select, gather, index_add_, scatter_add_: values against coordinate arithmetic in
// float64, non-contiguous operands, int32 and int64 indices, deterministic adds whatever
// the thread count, and IndexError naming the bad index.
#include <omp.h>

#include "kernels/fill.h"
#include "kernels/index.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_equal;
using testing::random_index;
using testing::random_tensor;
using testing::strided_copy;
using testing::to_f64;

// Values in [-2, 2) on a grid of 1/4 (integers for integer dtypes): sums of a dozen of them
// are exact in every dtype, bfloat16 included, so adds compare bit for bit in any order.
Tensor random_quarters(Shape shape, DType dtype, uint64_t seed) {
  Tensor t = random_tensor(std::move(shape), kFloat64, seed, -2.0, 2.0);
  const double grid = is_floating(dtype) ? 4.0 : 1.0;
  for (int64_t i = 0; i < t.numel(); ++i) t.data_ptr<double>()[i] = std::floor(t.data_ptr<double>()[i] * grid) / grid;
  return t.to(dtype);
}

// Row-major coordinates of flat position p in shape, and back.
Shape unravel(int64_t p, const Shape& shape) {
  Shape c(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    c[d] = p % shape[d];
    p /= shape[d];
  }
  return c;
}
int64_t ravel(const Shape& c, const Shape& shape) {
  int64_t p = 0;
  for (size_t d = 0; d < shape.size(); ++d) p = p * shape[d] + c[d];
  return p;
}

// gather by coordinates: out[c] = x[c with c[dim] = index[c]].
std::vector<double> gather_reference(const Tensor& x, int64_t dim, const Tensor& index) {
  const std::vector<double> xv = to_f64(x), iv = to_f64(index);
  std::vector<double> out(iv.size());
  for (size_t p = 0; p < iv.size(); ++p) {
    Shape c = unravel(static_cast<int64_t>(p), index.shape());
    c[dim] = static_cast<int64_t>(iv[p]);
    out[p] = xv[ravel(c, x.shape())];
  }
  return out;
}

// index_select(x, dim, index) is gather with the 1-D index broadcast over the other dims.
std::vector<double> index_select_reference(const Tensor& x, int64_t dim, const Tensor& index) {
  Shape shape = x.shape(), view(x.dim(), 1);
  shape[dim] = view[dim] = index.numel();
  return gather_reference(x, dim, index.contiguous().view(view).expand(shape));
}

// scatter-add by coordinates, in row-major order of src's positions under index.
std::vector<double> scatter_add_reference(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  std::vector<double> out = to_f64(x);
  const std::vector<double> iv = to_f64(index), sv = to_f64(src);
  for (size_t p = 0; p < iv.size(); ++p) {
    Shape c = unravel(static_cast<int64_t>(p), index.shape());
    const double s = sv[ravel(c, src.shape())];
    c[dim] = static_cast<int64_t>(iv[p]);
    out[ravel(c, x.shape())] += s;
  }
  return out;
}

std::vector<double> index_add_reference(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source) {
  Shape view(x.dim(), 1);
  view[dim] = index.numel();
  return scatter_add_reference(x, dim, index.contiguous().view(view).expand(source.shape()), source);
}

TEST_CASE("index_select picks rows along any dim for every dtype, index dtype and layout", "[index_select]") {
  uint64_t seed = 100;
  for (DType dtype : testing::kAllDTypes) {
    for (int64_t n : testing::kAwkwardSizes) {
      for (DType index_dtype : {kInt64, kInt32}) {
        const int64_t k = n == 0 ? 0 : 9;
        Tensor index = random_index({k}, n, index_dtype, seed++);
        Tensor rows = random_tensor({n, 5}, dtype, seed++);
        check_equal(index_select(rows, 0, index), Shape{k, 5}, index_select_reference(rows, 0, index),
                    fmt::format("index_select dim 0, n={}", n));
        Tensor cols = strided_copy(random_tensor({3, n}, dtype, seed++));
        Tensor picked = index_select(cols, -1, strided_copy(index));
        CHECK(picked.shape() == Shape{3, k});
        check_equal(picked, Shape{3, k}, index_select_reference(cols, 1, index),
                    fmt::format("index_select dim -1, n={}", n));
        Tensor cube = random_tensor({4, n, 3}, dtype, seed++).transpose(0, 2);  // [3, n, 4]
        check_equal(index_select(cube, 1, index), Shape{3, k, 4}, index_select_reference(cube, 1, index),
                    fmt::format("index_select dim 1 of a transposed cube, n={}", n));
      }
    }
  }
}

TEST_CASE("index_select of embedding rows matches on one thread and on many", "[index_select]") {
  // 4097 lookups of 64-wide rows (1 MiB): the multi-threaded row-copy path.
  Tensor table = random_tensor({1023, 64}, kFloat32, 7);
  Tensor index = random_index({4097}, 1023, kInt64, 8);
  const std::vector<double> expected = index_select_reference(table, 0, index);
  const int threads = omp_get_max_threads();
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    check_equal(index_select(table, 0, index), Shape{4097, 64}, expected,
                fmt::format("embedding lookup, {} threads", t));
  }
  omp_set_num_threads(threads);
}

TEST_CASE("index_select and gather: exact values of arange", "[index_select][gather]") {
  Tensor x = arange(0.0, 12.0, 1.0, kFloat32).view({3, 4});
  check_equal(index_select(x, 0, Tensor::from_vector<int64_t>({2, 0, 2})), Shape{3, 4},
              {8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11}, "index_select rows");
  check_equal(index_select(x, 1, Tensor::from_vector<int32_t>({3, 1})), Shape{3, 2}, {3, 1, 7, 5, 11, 9},
              "index_select cols");
  check_equal(index_select(x, 0, Tensor::empty({0}, kInt64)), Shape{0, 4}, {}, "empty index");
  // torch.gather's documented example: gather(t, 1, [[0, 0], [1, 0]]) of [[1, 2], [3, 4]].
  Tensor t = Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2});
  check_equal(gather(t, 1, Tensor::from_vector<int64_t>({0, 0, 1, 0}, {2, 2})), Shape{2, 2}, {1, 1, 4, 3},
              "torch's example");
  check_equal(gather(x, 0, Tensor::from_vector<int64_t>({2, 1, 0}, {1, 3})), Shape{1, 3}, {8, 5, 2}, "gather dim 0");
}

TEST_CASE("gather matches coordinate arithmetic, index smaller than x, strided operands", "[gather]") {
  uint64_t seed = 200;
  for (DType dtype : testing::kAllDTypes) {
    for (int64_t n : testing::kAwkwardSizes) {
      for (DType index_dtype : {kInt64, kInt32}) {
        Tensor x = random_tensor({n, 6}, dtype, seed++);
        Tensor along0 = random_index({n == 0 ? 0 : 5, 4}, n, index_dtype, seed++);  // 4 <= 6 columns
        check_equal(gather(x, 0, along0), along0.shape(), gather_reference(x, 0, along0),
                    fmt::format("gather dim 0, n={}", n));
        Tensor along1 = strided_copy(random_index({n, 9}, 6, index_dtype, seed++));
        Tensor xs = strided_copy(x);
        Tensor out = gather(xs, 1, along1);
        CHECK(out.shape() == Shape{n, 9});
        check_equal(out, along1.shape(), gather_reference(xs, 1, along1),
                    fmt::format("gather dim 1, strided, n={}", n));
        Tensor cube = random_tensor({2, n, 3}, dtype, seed++).permute({2, 1, 0});  // [3, n, 2]
        Tensor picks = random_index({3, n, 1}, 2, index_dtype, seed++);
        check_equal(gather(cube, 2, picks), picks.shape(), gather_reference(cube, 2, picks),
                    fmt::format("gather dim 2 of a permuted cube, n={}", n));
      }
    }
  }
}

TEST_CASE("index_add_ accumulates repeated rows exactly like the float64 reference", "[index_add]") {
  uint64_t seed = 300;
  for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64}) {
    for (int64_t n : testing::kAwkwardSizes) {
      const int64_t k = n == 0 ? 0 : 11;  // 11 > 7 and > 1: repeated indices for small n
      Tensor index = random_index({k}, n, kInt64, seed++);
      Tensor x = random_quarters({n, 5}, dtype, seed++);
      Tensor source = random_quarters({k, 5}, dtype, seed++);
      const std::vector<double> expected = index_add_reference(x, 0, index, source);
      index_add_(x, 0, index, source);
      check_equal(x, x.shape(), expected, fmt::format("index_add_ dim 0, n={}", n));

      Tensor y = strided_copy(random_quarters({4, n}, dtype, seed++));
      Tensor cols = random_quarters({k, 4}, dtype, seed++).t();  // [4, k], not contiguous
      Tensor index32 = random_index({k}, n, kInt32, seed++);
      const std::vector<double> expected_cols = index_add_reference(y, 1, index32, cols);
      index_add_(y, -1, index32, cols);
      check_equal(y, y.shape(), expected_cols, fmt::format("index_add_ dim -1, strided, n={}", n));
    }
  }
}

TEST_CASE("scatter_add_ matches the float64 reference exactly, src larger than index", "[scatter_add]") {
  uint64_t seed = 400;
  for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64}) {
    for (int64_t n : testing::kAwkwardSizes) {
      for (DType index_dtype : {kInt64, kInt32}) {
        Tensor x = random_quarters({n, 4}, dtype, seed++);
        Tensor src = random_quarters({9, 5}, dtype, seed++);
        Tensor index = random_index({n == 0 ? 0 : 7, 3}, n, index_dtype, seed++);
        const std::vector<double> expected = scatter_add_reference(x, 0, index, src);
        scatter_add_(x, 0, index, src);
        check_equal(x, x.shape(), expected, fmt::format("scatter_add_ dim 0, n={}", n));

        Tensor y = strided_copy(random_quarters({n, 3}, dtype, seed++));
        Tensor ysrc = strided_copy(random_quarters({n, 8}, dtype, seed++));
        Tensor yindex = strided_copy(random_index({n, 8}, 3, index_dtype, seed++));
        const std::vector<double> expected_y = scatter_add_reference(y, 1, yindex, ysrc);
        scatter_add_(y, 1, yindex, ysrc);
        check_equal(y, y.shape(), expected_y, fmt::format("scatter_add_ dim 1, strided, n={}", n));
      }
    }
  }
}

TEST_CASE("index_add_ and scatter_add_ are exact on small integers", "[index_add][scatter_add]") {
  Tensor x = zeros({3, 2}, kBFloat16);
  Tensor rows = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {3, 2}).to(kBFloat16);
  index_add_(x, 0, Tensor::from_vector<int64_t>({2, 0, 2}), rows);
  check_equal(x, Shape{3, 2}, {3, 4, 0, 0, 6, 8}, "index_add_ rows");
  // torch's scatter_add_ example: ones(2, 5) scattered into zeros(3, 5) at [[0, 1, 2, 0, 0]].
  Tensor y = zeros({3, 5});
  scatter_add_(y, 0, Tensor::from_vector<int64_t>({0, 1, 2, 0, 0}, {1, 5}), ones({2, 5}));
  check_equal(y, Shape{3, 5}, {1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0}, "torch's example");
}

TEST_CASE("repeated-index adds give the same bits on 1, 2 and 3 threads: index order", "[index_add][scatter_add]") {
  // 4097 rows of 128 floats added into 3 rows (1023 x 3 elements for scatter): far above the
  // threaded size, with each target hit over a thousand times.
  Tensor index = random_index({4097}, 3, kInt64, 9);
  Tensor source = random_tensor({4097, 128}, kFloat32, 10);
  Tensor scatter_index = random_index({4097, 1023}, 3, kInt32, 11);
  Tensor src = random_tensor({4097, 1023}, kFloat32, 12);
  // The order the header promises, computed in float: each target's adds in index order.
  std::vector<float> rows(3 * 128, 0.0f), cols(3 * 1023, 0.0f);
  const std::vector<double> iv = to_f64(index), sv = to_f64(source), siv = to_f64(scatter_index), srcv = to_f64(src);
  for (int64_t k = 0; k < 4097; ++k) {
    for (int64_t j = 0; j < 128; ++j) {
      rows[static_cast<int64_t>(iv[k]) * 128 + j] += static_cast<float>(sv[k * 128 + j]);
    }
    for (int64_t j = 0; j < 1023; ++j) {
      cols[static_cast<int64_t>(siv[k * 1023 + j]) * 1023 + j] += static_cast<float>(srcv[k * 1023 + j]);
    }
  }
  const int threads = omp_get_max_threads();
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    Tensor x = zeros({3, 128});
    index_add_(x, 0, index, source);
    check_equal(x, Shape{3, 128}, std::vector<double>(rows.begin(), rows.end()),
                fmt::format("index_add_, {} threads", t));
    Tensor y = zeros({3, 1023});
    scatter_add_(y, 0, scatter_index, src);
    check_equal(y, Shape{3, 1023}, std::vector<double>(cols.begin(), cols.end()),
                fmt::format("scatter_add_, {} threads", t));
  }
  omp_set_num_threads(threads);
}

TEST_CASE("out-of-range indices raise IndexError naming value, position, dim and size", "[index][errors]") {
  Tensor x = zeros({5, 3});
  Tensor bad = Tensor::from_vector<int64_t>({0, 4, 5});
  CHECK_THROWS_AS(index_select(x, 0, bad), IndexError);
  CHECK_THROWS_WITH(index_select(x, 0, bad), Catch::Contains("index_select: index 5 at position [2]") &&
                                                 Catch::Contains("dim 0 of size 5") && Catch::Contains("[0, 5)"));
  CHECK_THROWS_WITH(index_select(x, 1, Tensor::from_vector<int32_t>({-1}, {1})),
                    Catch::Contains("index -1 at position [0]") && Catch::Contains("dim 1 of size 3"));
  CHECK_THROWS_WITH(gather(x, 1, Tensor::from_vector<int64_t>({0, 1, 2, 3}, {2, 2})),
                    Catch::Contains("gather: index 3 at position [1, 1]") && Catch::Contains("dim 1 of size 3"));
  CHECK_THROWS_AS(index_add_(x, 0, bad, zeros({3, 3})), IndexError);
  CHECK_THROWS_WITH(scatter_add_(x, 0, Tensor::from_vector<int64_t>({7}, {1, 1}), zeros({1, 1})),
                    Catch::Contains("scatter_add_: index 7 at position [0, 0]"));
  check_equal(x, Shape{5, 3}, std::vector<double>(15, 0.0), "a rejected add leaves x untouched");
}

TEST_CASE("indexing ops reject bad shapes and dtypes with typed errors", "[index][errors]") {
  Tensor x = zeros({4, 3});
  Tensor idx = Tensor::from_vector<int64_t>({0, 1});
  CHECK_THROWS_AS(index_select(x, 0, idx.to(kFloat32)), TypeError);
  CHECK_THROWS_WITH(index_select(x, 0, idx.to(kFloat32)),
                    Catch::Contains("float32[2]") && Catch::Contains("int64 or int32"));
  CHECK_THROWS_WITH(index_select(x, 0, idx.view({1, 2})), Catch::Contains("int64[1, 2]") && Catch::Contains("1-D"));
  CHECK_THROWS_AS(index_select(x, 2, idx), IndexError);
  CHECK_THROWS_WITH(index_select(zeros({}), 0, idx), Catch::Contains("0-d"));
  CHECK_THROWS_WITH(gather(x, 0, idx), Catch::Contains("same number of dims"));
  CHECK_THROWS_WITH(gather(x, 0, zeros({2, 4}, kInt64)),
                    Catch::Contains("int64[2, 4] is larger than x float32[4, 3] in dim 1"));
  CHECK_THROWS_WITH(index_add_(x, 0, idx, zeros({2, 4})),
                    Catch::Contains("source is float32[2, 4]") && Catch::Contains("must be float32[2, 3]"));
  CHECK_THROWS_AS(index_add_(x, 0, idx, zeros({2, 3}, kFloat64)), TypeError);
  CHECK_THROWS_WITH(index_add_(x, 0, idx, zeros({2, 3}, kFloat64)), Catch::Contains("same dtype"));
  Tensor flags = zeros({4, 3}, kBool);
  CHECK_THROWS_AS(index_add_(flags, 0, idx, zeros({2, 3}, kBool)), TypeError);
  Tensor expanded = zeros({1, 3}).expand({4, 3});
  CHECK_THROWS_WITH(index_add_(expanded, 0, idx, zeros({2, 3})), Catch::Contains("expanded view"));
  CHECK_THROWS_WITH(scatter_add_(x, 0, zeros({2, 2}, kInt64), zeros({1, 3})),
                    Catch::Contains("larger than src float32[1, 3]") && Catch::Contains("in dim 0"));
}

}  // namespace
}  // namespace dtr
