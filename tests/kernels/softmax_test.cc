// softmax and log_softmax, forward and backward, against float64 loops written here: every
// floating dtype, slice sizes 0/1/7/1023/4097, every dim of a 3-D tensor, non-contiguous
// inputs; backward against the explicit Jacobian product; exact 1/C for equal logits;
// large logits stay finite; typed errors.
#include "kernels/softmax.h"

#include <cmath>
#include <limits>

#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::to_f64;

// Row-major index arithmetic for slices along `dim` of `shape`.
struct SliceIndex {
  int64_t outer = 1, size = 1, inner = 1;
  SliceIndex(const Shape& shape, int64_t dim) {
    for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
    size = shape[dim];
    for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  }
  int64_t at(int64_t o, int64_t c, int64_t j) const { return (o * size + c) * inner + j; }
};

// softmax (log = false) or log_softmax (log = true) of row-major values along dim, in float64.
std::vector<double> reference_softmax(const std::vector<double>& x, const Shape& shape, int64_t dim, bool log) {
  SliceIndex s(shape, dim);
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j = 0; j < s.inner; ++j) {
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < s.size; ++c) max = std::max(max, x[s.at(o, c, j)]);
      double sum = 0.0;
      for (int64_t c = 0; c < s.size; ++c) sum += std::exp(x[s.at(o, c, j)] - max);
      for (int64_t c = 0; c < s.size; ++c) {
        const double v = x[s.at(o, c, j)] - max;
        y[s.at(o, c, j)] = log ? v - std::log(sum) : std::exp(v) / sum;
      }
    }
  return y;
}

// grad_x_k = sum_i grad_y_i * dy_i/dx_k with the Jacobian written out element by element:
// softmax dy_i/dx_k = p_i (delta_ik - p_k); log_softmax dy_i/dx_k = delta_ik - p_k.
std::vector<double> reference_backward(const std::vector<double>& g, const std::vector<double>& p, const Shape& shape,
                                       int64_t dim, bool log) {
  SliceIndex s(shape, dim);
  std::vector<double> gx(g.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j = 0; j < s.inner; ++j)
      for (int64_t k = 0; k < s.size; ++k) {
        double acc = 0.0;
        for (int64_t i = 0; i < s.size; ++i) {
          const double delta = i == k ? 1.0 : 0.0;
          const double pi = p[s.at(o, i, j)], pk = p[s.at(o, k, j)];
          const double jacobian = log ? delta - pk : pi * (delta - pk);
          acc += g[s.at(o, i, j)] * jacobian;
        }
        gx[s.at(o, k, j)] = acc;
      }
  return gx;
}

// Cases: (shape, dim) pairs covering every slice size and every dim of a 3-D tensor.
struct Case {
  Shape shape;
  int64_t dim;
};
std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t c : testing::kAwkwardSizes) {
    out.push_back({{3, c}, -1});
    out.push_back({{c, 2}, 0});
  }
  for (int64_t d = 0; d < 3; ++d) out.push_back({{4, 7, 5}, d});
  out.push_back({{}, 0});  // a 0-d tensor: softmax 1, log_softmax 0
  return out;
}

TEST_CASE("softmax and log_softmax match float64 references", "[softmax]") {
  uint64_t seed = 1;
  for (DType dtype : testing::kFloatDTypes) {
    for (const Case& k : cases()) {
      Tensor x = testing::random_tensor(k.shape, dtype, seed++, -8.0, 8.0);
      const std::vector<double> xv = to_f64(x);
      // A 0-d tensor is one slice of one element: softmax 1, log_softmax 0.
      const bool scalar = k.shape.empty();
      const int64_t d = scalar ? 0 : (k.dim + static_cast<int64_t>(k.shape.size())) % k.shape.size();
      const std::vector<double> p = scalar ? std::vector<double>{1.0} : reference_softmax(xv, k.shape, d, false);
      const std::vector<double> lp = scalar ? std::vector<double>{0.0} : reference_softmax(xv, k.shape, d, true);
      const std::string what = fmt::format("dim {} of {}", k.dim, describe(x));
      for (const Tensor& input : {x, testing::strided_copy(x)}) {
        Tensor y = softmax(input, k.dim);
        CHECK(y.shape() == x.shape());
        CHECK(y.dtype() == dtype);
        testing::check_close(y, x.shape(), p, "softmax " + what);
        // log-probabilities reach -16 - log(C): their tolerance is relative to that scale.
        testing::Tolerance tol = testing::tolerance_for(dtype);
        tol.atol *= 10;
        testing::check_close(log_softmax(input, k.dim), x.shape(), lp, tol, "log_softmax " + what);
      }
    }
  }
}

TEST_CASE("softmax along a transposed view equals softmax of its contiguous copy", "[softmax]") {
  Tensor x = testing::random_tensor({9, 1023}, kFloat32, 3);
  Tensor xt = x.t();  // [1023, 9], strides [1, 1023]
  const std::vector<double> expected = reference_softmax(to_f64(xt), {1023, 9}, 0, false);
  testing::check_close(softmax(xt, 0), Shape{1023, 9}, expected, "softmax over dim 0 of a transposed view");
  testing::check_close(softmax(xt.contiguous(), 0), Shape{1023, 9}, expected, "softmax over dim 0, contiguous");
}

TEST_CASE("softmax_backward and log_softmax_backward equal the explicit Jacobian product", "[softmax][backward]") {
  uint64_t seed = 100;
  for (DType dtype : testing::kFloatDTypes) {
    for (const Case& k : cases()) {
      if (k.shape.empty()) continue;
      const int64_t d = (k.dim + static_cast<int64_t>(k.shape.size())) % k.shape.size();
      Tensor x = testing::random_tensor(k.shape, dtype, seed++, -4.0, 4.0);
      Tensor g = testing::random_tensor(k.shape, dtype, seed++);
      const std::string what = fmt::format("dim {} of {}", k.dim, describe(x));
      // The references take the y actually passed in (rounded to dtype) as p.
      Tensor y = softmax(x, k.dim);
      const std::vector<double> gs = reference_backward(to_f64(g), to_f64(y), k.shape, d, false);
      testing::Tolerance tol = testing::tolerance_for(dtype);
      testing::check_close(softmax_backward(g, y, k.dim), x.shape(), gs, tol, "softmax_backward " + what);
      testing::check_close(softmax_backward(testing::strided_copy(g), testing::strided_copy(y), k.dim), x.shape(), gs,
                           tol, "softmax_backward strided " + what);
      Tensor ly = log_softmax(x, k.dim);
      std::vector<double> lp = to_f64(ly);
      for (double& v : lp) v = std::exp(v);
      const std::vector<double> gl = reference_backward(to_f64(g), lp, k.shape, d, true);
      // sum(grad_y) over up to 4097 elements scales the error of exp(y) * sum.
      tol.atol *= 10;
      testing::check_close(log_softmax_backward(g, ly, k.dim), x.shape(), gl, tol, "log_softmax_backward " + what);
    }
  }
}

TEST_CASE("softmax of equal logits is exactly 1/C for C a power of two", "[softmax][exact]") {
  for (DType dtype : testing::kFloatDTypes) {
    for (int64_t c : {1, 2, 8, 1024}) {
      Tensor x = full({3, c}, 0.75, dtype);
      testing::check_equal(softmax(x, 1), Shape{3, c}, std::vector<double>(3 * c, 1.0 / c), "equal logits");
      testing::check_equal(softmax(full({c, 2}, -3.0, dtype), 0), Shape{c, 2}, std::vector<double>(2 * c, 1.0 / c),
                           "equal logits, dim 0");
    }
    // log_softmax of two equal logits is -log 2, rounded once.
    testing::check_equal(log_softmax(full({2}, 5.0, dtype), 0), full({2}, -std::log(2.0), dtype),
                         "log_softmax of [5, 5]");
  }
}

TEST_CASE("large logits neither overflow nor lose the small probabilities", "[softmax]") {
  Tensor x = Tensor::from_vector(std::vector<double>{1000.0, 1000.0, 990.0});
  const double small = std::exp(-10.0) / (2.0 + std::exp(-10.0));
  const double big = 1.0 / (2.0 + std::exp(-10.0));
  testing::check_close(softmax(x, 0), Shape{3}, {big, big, small}, "softmax of ~1000");
  testing::check_close(log_softmax(x, 0), Shape{3}, {std::log(big), std::log(big), std::log(small)},
                       "log_softmax of ~1000");
  Tensor xf = x.to(kFloat32);
  testing::check_close(softmax(xf, 0), Shape{3}, {big, big, small}, "float32 softmax of ~1000");
}

TEST_CASE("softmax ops reject bad arguments with typed errors", "[softmax][errors]") {
  Tensor x = Tensor::empty({2, 3});
  CHECK_THROWS_AS(softmax(x, 2), IndexError);
  CHECK_THROWS_WITH(softmax(x, -3), Catch::Contains("softmax") && Catch::Contains("dim -3"));
  CHECK_THROWS_AS(log_softmax(Tensor::empty({2}, kInt64), 0), TypeError);
  CHECK_THROWS_WITH(log_softmax(Tensor::empty({2}, kInt64), 0), Catch::Contains("int64[2]"));
  CHECK_THROWS_AS(softmax_backward(Tensor::empty({2, 4}), x, 1), ValueError);
  CHECK_THROWS_WITH(
      log_softmax_backward(Tensor::empty({2, 3}, kFloat64), x, 1),
      Catch::Contains("log_softmax_backward") && Catch::Contains("float64[2, 3]") && Catch::Contains("float32[2, 3]"));
}

}  // namespace
}  // namespace dtr
