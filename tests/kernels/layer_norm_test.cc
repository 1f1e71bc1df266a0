// layer_norm forward and backward against float64 references written here: every floating
// dtype, row lengths 0/1/7/1023/4097, normalising 1 and 2 dims, with and without weight and
// bias, non-contiguous inputs; backward against the explicit Jacobian and a central finite
// difference of the float64 forward; an exact case; thread-count independence; errors.
#include "kernels/layer_norm.h"

#include <cmath>

#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::to_f64;

struct Reference {
  std::vector<double> y, mean, rstd;
};

// y = (x - mean) / sqrt(var + eps) * w + b per row of n, in float64 (w, b empty = absent).
// Rows of no elements have mean and rstd NaN (0 / 0).
Reference reference_forward(const std::vector<double>& x, int64_t rows, int64_t n, const std::vector<double>& w,
                            const std::vector<double>& b, double eps) {
  Reference r;
  for (int64_t row = 0; row < rows; ++row) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < n; ++i) mean += x[row * n + i];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) var += (x[row * n + i] - mean) * (x[row * n + i] - mean);
    var /= n;
    const double rstd = 1.0 / std::sqrt(var + eps);
    r.mean.push_back(mean);
    r.rstd.push_back(rstd);
    for (int64_t i = 0; i < n; ++i) {
      r.y.push_back((x[row * n + i] - mean) * rstd * (w.empty() ? 1.0 : w[i]) + (b.empty() ? 0.0 : b[i]));
    }
  }
  return r;
}

struct ReferenceGrads {
  std::vector<double> x, w, b;
};

// grad_x_j = sum_i g_i dy_i/dx_j with the Jacobian written out element by element,
//   dy_i/dx_j = w_i * rstd * (delta_ij - 1/n - xhat_i * xhat_j / n),
// and grad_w_i = sum_rows g_i xhat_i, grad_b_i = sum_rows g_i.
ReferenceGrads reference_backward(const std::vector<double>& g, const std::vector<double>& x, int64_t rows, int64_t n,
                                  const std::vector<double>& w, double eps) {
  const Reference f = reference_forward(x, rows, n, {}, {}, eps);
  ReferenceGrads r{std::vector<double>(x.size()), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  for (size_t row = 0; row < f.mean.size(); ++row) {
    const double* xhat = &f.y[row * n];
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double jacobian =
            (w.empty() ? 1.0 : w[i]) * f.rstd[row] * ((i == j ? 1.0 : 0.0) - 1.0 / n - xhat[i] * xhat[j] / n);
        acc += g[row * n + i] * jacobian;
      }
      r.x[row * n + j] = acc;
    }
    for (int64_t i = 0; i < n; ++i) {
      r.w[i] += g[row * n + i] * xhat[i];
      r.b[i] += g[row * n + i];
    }
  }
  return r;
}

std::vector<double> values_or_empty(const std::optional<Tensor>& t) { return t ? to_f64(*t) : std::vector<double>{}; }

struct Case {
  Shape shape;
  Shape normalized_shape;
};
std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t n : testing::kAwkwardSizes) out.push_back({{3, n}, {n}});
  out.push_back({{2, 5, 7}, {5, 7}});  // two normalised dims
  out.push_back({{7}, {7}});           // one row: mean and rstd are 0-d
  out.push_back({{0, 4}, {4}});        // no rows
  return out;
}

TEST_CASE("layer_norm matches a float64 reference with and without weight and bias", "[layer_norm]") {
  uint64_t seed = 1;
  for (DType dtype : testing::kFloatDTypes) {
    for (const Case& k : cases()) {
      const int64_t n = shape_numel(k.normalized_shape);
      const Shape row_shape(k.shape.begin(), k.shape.end() - static_cast<int64_t>(k.normalized_shape.size()));
      Tensor x = testing::random_tensor(k.shape, dtype, seed++, -3.0, 5.0);
      std::optional<Tensor> weight = testing::random_tensor(k.normalized_shape, dtype, seed++, 0.5, 2.0);
      std::optional<Tensor> bias = testing::random_tensor(k.normalized_shape, dtype, seed++);
      for (bool affine : {false, true}) {
        const std::optional<Tensor> w = affine ? weight : std::nullopt;
        const std::optional<Tensor> b = affine ? bias : std::nullopt;
        const Reference ref =
            reference_forward(to_f64(x), shape_numel(row_shape), n, values_or_empty(w), values_or_empty(b), 1e-5);
        const std::string what = fmt::format("{} over {}, affine {}", describe(x), k.normalized_shape, affine);
        for (const Tensor& input : {x, testing::strided_copy(x)}) {
          LayerNormOutput out = layer_norm(input, k.normalized_shape, w, b, 1e-5);
          CHECK(out.y.shape() == x.shape());
          CHECK(out.y.dtype() == dtype);
          CHECK(out.mean.shape() == row_shape);
          CHECK(out.rstd.shape() == row_shape);
          CHECK(out.mean.dtype() == (dtype == kFloat64 ? kFloat64 : kFloat32));
          testing::Tolerance tol = testing::tolerance_for(dtype);
          tol.atol *= 4;  // y reaches ~|4 * 2 + 1| for the widest rows
          testing::check_close(out.y, x.shape(), ref.y, tol, "layer_norm y " + what);
          // Statistics are float32 (of dtype-rounded inputs) for every dtype but float64.
          const testing::Tolerance stats_tol = testing::tolerance_for(dtype == kFloat64 ? kFloat64 : kFloat32);
          testing::check_close(out.mean, row_shape, ref.mean, stats_tol, "layer_norm mean " + what);
          testing::check_close(out.rstd, row_shape, ref.rstd, stats_tol, "layer_norm rstd " + what);
        }
      }
    }
  }
}

TEST_CASE("layer_norm_backward equals the explicit Jacobian product", "[layer_norm][backward]") {
  uint64_t seed = 100;
  for (DType dtype : testing::kFloatDTypes) {
    for (const Case& k : cases()) {
      const int64_t n = shape_numel(k.normalized_shape);
      Tensor x = testing::random_tensor(k.shape, dtype, seed++, -3.0, 5.0);
      Tensor g = testing::random_tensor(k.shape, dtype, seed++);
      Tensor weight = testing::random_tensor(k.normalized_shape, dtype, seed++, 0.5, 2.0);
      for (bool affine : {false, true}) {
        const std::optional<Tensor> w = affine ? std::optional<Tensor>(weight) : std::nullopt;
        LayerNormOutput f = layer_norm(x, k.normalized_shape, w, std::nullopt, 1e-5);
        const ReferenceGrads ref =
            reference_backward(to_f64(g), to_f64(x), f.mean.numel(), n, values_or_empty(w), 1e-5);
        const std::string what = fmt::format("{} over {}, affine {}", describe(x), k.normalized_shape, affine);
        LayerNormGrads grads = layer_norm_backward(testing::strided_copy(g), x, f.mean, f.rstd, w);
        CHECK(grads.grad_x.shape() == x.shape());
        CHECK(grads.grad_weight.shape() == k.normalized_shape);
        CHECK(grads.grad_bias.shape() == k.normalized_shape);
        testing::Tolerance tol = testing::tolerance_for(dtype);
        tol.atol *= 4;
        testing::check_close(grads.grad_x, x.shape(), ref.x, tol, "grad_x " + what);
        testing::check_close(grads.grad_weight, k.normalized_shape, ref.w, tol, "grad_weight " + what);
        testing::check_close(grads.grad_bias, k.normalized_shape, ref.b, tol, "grad_bias " + what);
      }
    }
  }
}

TEST_CASE("layer_norm_backward agrees with a central finite difference of the float64 forward",
          "[layer_norm][backward]") {
  // loss = sum(g * layer_norm(x)); d loss / d x, w, b by (loss(+h) - loss(-h)) / 2h.
  const Shape shape{3, 2, 5};
  const Shape normalized{2, 5};
  Tensor x = testing::random_tensor(shape, kFloat64, 1, -2.0, 2.0);
  Tensor w = testing::random_tensor(normalized, kFloat64, 2, 0.5, 1.5);
  Tensor b = testing::random_tensor(normalized, kFloat64, 3);
  Tensor g = testing::random_tensor(shape, kFloat64, 4);
  const std::vector<double> gv = to_f64(g);
  auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
    const Reference r = reference_forward(xv, 3, 10, wv, bv, 1e-5);
    double s = 0.0;
    for (size_t i = 0; i < gv.size(); ++i) s += gv[i] * r.y[i];
    return s;
  };
  auto numeric = [&](int which) {
    std::vector<double> v[3] = {to_f64(x), to_f64(w), to_f64(b)};
    std::vector<double> d(v[which].size());
    const double h = 1e-6;
    for (size_t i = 0; i < d.size(); ++i) {
      const double saved = v[which][i];
      v[which][i] = saved + h;
      const double up = loss(v[0], v[1], v[2]);
      v[which][i] = saved - h;
      const double down = loss(v[0], v[1], v[2]);
      v[which][i] = saved;
      d[i] = (up - down) / (2 * h);
    }
    return d;
  };
  LayerNormOutput f = layer_norm(x, normalized, w, b, 1e-5);
  LayerNormGrads grads = layer_norm_backward(g, x, f.mean, f.rstd, w);
  const testing::Tolerance fd{1e-7, 1e-6};
  testing::check_close(grads.grad_x, shape, numeric(0), fd, "grad_x vs finite difference");
  testing::check_close(grads.grad_weight, normalized, numeric(1), fd, "grad_weight vs finite difference");
  testing::check_close(grads.grad_bias, normalized, numeric(2), fd, "grad_bias vs finite difference");
}

TEST_CASE("layer_norm of rows with exactly known mean and variance is exact", "[layer_norm][exact]") {
  // Rows [1, 3, 1, 3] (mean 2, var 1) and [0, 0, 4, 4] (mean 2, var 4); eps 0.
  const std::vector<double> xv{1, 3, 1, 3, 0, 0, 4, 4};
  for (DType dtype : testing::kFloatDTypes) {
    Tensor x = Tensor::from_vector(xv, {2, 4}).to(dtype);
    Tensor w = Tensor::from_vector(std::vector<double>{2, 2, 0.5, 1}).to(dtype);
    Tensor b = Tensor::from_vector(std::vector<double>{0.5, 0, 0, -1}).to(dtype);
    LayerNormOutput out = layer_norm(x, {4}, w, b, 0.0);
    testing::check_equal(out.y, Shape{2, 4}, {-1.5, 2, -0.5, 0, -1.5, -2, 0.5, 0}, "y");
    testing::check_equal(out.mean, Shape{2}, {2, 2}, "mean");
    testing::check_equal(out.rstd, Shape{2}, {1, 0.5}, "rstd");
    // grad_y = 1 everywhere: grad_bias counts rows, grad_weight sums xhat = [-2, 0, 0, 2].
    LayerNormGrads grads = layer_norm_backward(ones({2, 4}, dtype), x, out.mean, out.rstd, w);
    testing::check_equal(grads.grad_bias, Shape{4}, {2, 2, 2, 2}, "grad_bias");
    testing::check_equal(grads.grad_weight, Shape{4}, {-2, 0, 0, 2}, "grad_weight");
  }
}

TEST_CASE("layer_norm_backward is bitwise the same on 1 and 2 threads", "[layer_norm][parallel]") {
  testing::ThreadCountGuard guard;
  Tensor x = testing::random_tensor({4097, 33}, kFloat32, 5);
  Tensor g = testing::random_tensor({4097, 33}, kFloat32, 6);
  Tensor w = testing::random_tensor({33}, kFloat32, 7);
  LayerNormOutput f = layer_norm(x, {33}, w, std::nullopt);
  set_num_threads(1);
  LayerNormGrads one = layer_norm_backward(g, x, f.mean, f.rstd, w);
  set_num_threads(2);
  LayerNormGrads two = layer_norm_backward(g, x, f.mean, f.rstd, w);
  testing::check_equal(two.grad_x, one.grad_x, "grad_x");
  testing::check_equal(two.grad_weight, one.grad_weight, "grad_weight");
  testing::check_equal(two.grad_bias, one.grad_bias, "grad_bias");
  testing::check_equal(layer_norm(x, {33}, w, std::nullopt).y, f.y, "forward");
}

TEST_CASE("layer_norm rejects bad arguments with typed errors", "[layer_norm][errors]") {
  Tensor x = Tensor::empty({2, 3, 4});
  CHECK_THROWS_WITH(layer_norm(x, {3}, std::nullopt, std::nullopt),
                    Catch::Contains("layer_norm") && Catch::Contains("[3]") && Catch::Contains("float32[2, 3, 4]"));
  CHECK_THROWS_AS(layer_norm(x, {}, std::nullopt, std::nullopt), ValueError);
  CHECK_THROWS_AS(layer_norm(x, {1, 2, 3, 4}, std::nullopt, std::nullopt), ValueError);
  CHECK_THROWS_WITH(layer_norm(x, {4}, Tensor::empty({3}), std::nullopt),
                    Catch::Contains("weight") && Catch::Contains("float32[3]"));
  CHECK_THROWS_AS(layer_norm(x, {4}, std::nullopt, Tensor::empty({4}, kFloat64)), ValueError);
  CHECK_THROWS_AS(layer_norm(x, {4}, std::nullopt, std::nullopt, -1.0), ValueError);
  CHECK_THROWS_AS(layer_norm(Tensor::empty({2, 4}, kInt32), {4}, std::nullopt, std::nullopt), TypeError);
  LayerNormOutput f = layer_norm(x, {4}, std::nullopt, std::nullopt);
  CHECK_THROWS_WITH(layer_norm_backward(Tensor::empty({2, 3}), x, f.mean, f.rstd, std::nullopt),
                    Catch::Contains("layer_norm_backward") && Catch::Contains("grad_y"));
  CHECK_THROWS_WITH(layer_norm_backward(x, x, f.mean.to(kFloat64), f.rstd, std::nullopt),
                    Catch::Contains("mean") && Catch::Contains("float64[2, 3]"));
  CHECK_THROWS_AS(layer_norm_backward(x, x, f.mean, f.rstd, Tensor::empty({3, 4})), ValueError);
}

}  // namespace
}  // namespace dtr
