// rms_norm forward and backward against float64 references written here: every floating
// dtype, row lengths 0/1/7/1023/4097, normalising 1 and 2 dims, with and without weight,
// non-contiguous inputs, the default eps; backward against the explicit Jacobian and a
// central finite difference of the float64 forward; an exact case; thread-count
// independence; errors.
#include "kernels/rms_norm.h"

#include <cmath>
#include <limits>

#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::to_f64;

struct Reference {
  std::vector<double> y, rstd;
};

// The composed formula in float64: y = x / sqrt(mean(x^2) + eps) * w per row of n (w empty
// = absent). Rows of no elements have rstd NaN (0 / 0).
Reference reference_forward(const std::vector<double>& x, int64_t rows, int64_t n, const std::vector<double>& w,
                            double eps) {
  Reference r;
  for (int64_t row = 0; row < rows; ++row) {
    double squares = 0.0;
    for (int64_t i = 0; i < n; ++i) squares += x[row * n + i] * x[row * n + i];
    const double rstd = 1.0 / std::sqrt(squares / n + eps);
    r.rstd.push_back(rstd);
    for (int64_t i = 0; i < n; ++i) r.y.push_back(x[row * n + i] * rstd * (w.empty() ? 1.0 : w[i]));
  }
  return r;
}

struct ReferenceGrads {
  std::vector<double> x, w;
};

// grad_x_j = sum_i g_i dy_i/dx_j with the Jacobian written out element by element,
//   dy_i/dx_j = w_i * rstd * (delta_ij - xhat_i * xhat_j / n),   xhat = x * rstd,
// and grad_w_i = sum_rows g_i xhat_i.
ReferenceGrads reference_backward(const std::vector<double>& g, const std::vector<double>& x, int64_t rows, int64_t n,
                                  const std::vector<double>& w, double eps) {
  const Reference f = reference_forward(x, rows, n, {}, eps);
  ReferenceGrads r{std::vector<double>(x.size()), std::vector<double>(n, 0.0)};
  for (int64_t row = 0; row < rows; ++row) {
    const double* xhat = &f.y[row * n];
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double jacobian = (w.empty() ? 1.0 : w[i]) * f.rstd[row] * ((i == j ? 1.0 : 0.0) - xhat[i] * xhat[j] / n);
        acc += g[row * n + i] * jacobian;
      }
      r.x[row * n + j] = acc;
    }
    for (int64_t i = 0; i < n; ++i) r.w[i] += g[row * n + i] * xhat[i];
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
  out.push_back({{7}, {7}});           // one row: rstd is 0-d
  out.push_back({{0, 4}, {4}});        // no rows
  return out;
}

TEST_CASE("rms_norm matches the composed float64 formula with and without weight", "[rms_norm]") {
  uint64_t seed = 1;
  for (DType dtype : testing::kFloatDTypes) {
    for (const Case& k : cases()) {
      const int64_t n = shape_numel(k.normalized_shape);
      const Shape row_shape(k.shape.begin(), k.shape.end() - static_cast<int64_t>(k.normalized_shape.size()));
      Tensor x = testing::random_tensor(k.shape, dtype, seed++, -3.0, 5.0);
      const Tensor weight = testing::random_tensor(k.normalized_shape, dtype, seed++, 0.5, 2.0);
      for (bool affine : {false, true}) {
        const std::optional<Tensor> w = affine ? std::optional<Tensor>(weight) : std::nullopt;
        const Reference ref = reference_forward(to_f64(x), shape_numel(row_shape), n, values_or_empty(w), 1e-6);
        const std::string what = fmt::format("{} over {}, weight {}", describe(x), k.normalized_shape, affine);
        for (const Tensor& input : {x, testing::strided_copy(x)}) {
          RMSNormOutput out = rms_norm(input, k.normalized_shape, w, 1e-6);
          CHECK(out.y.shape() == x.shape());
          CHECK(out.y.dtype() == dtype);
          CHECK(out.rstd.shape() == row_shape);
          CHECK(out.rstd.dtype() == (dtype == kFloat64 ? kFloat64 : kFloat32));
          testing::Tolerance tol = testing::tolerance_for(dtype);
          tol.atol *= 4;  // |y| reaches ~ 2 * 5 / rms
          testing::check_close(out.y, x.shape(), ref.y, tol, "rms_norm y " + what);
          // rstd is float32 (of dtype-rounded inputs) for every dtype but float64.
          testing::check_close(out.rstd, row_shape, ref.rstd,
                               testing::tolerance_for(dtype == kFloat64 ? kFloat64 : kFloat32),
                               "rms_norm rstd " + what);
        }
      }
    }
  }
}

TEST_CASE("rms_norm's default eps is the machine epsilon of the input's dtype", "[rms_norm]") {
  CHECK(rms_norm_default_eps(kFloat32) == std::numeric_limits<float>::epsilon());
  CHECK(rms_norm_default_eps(kFloat64) == std::numeric_limits<double>::epsilon());
  CHECK(rms_norm_default_eps(kBFloat16) == std::ldexp(1.0, -7));
  CHECK(rms_norm_default_eps(kFloat16) == std::ldexp(1.0, -10));
  for (DType dtype : testing::kFloatDTypes) {
    // Small values, so that eps matters: rstd = 1 / sqrt(mean(x^2) + eps).
    Tensor x = testing::random_tensor({4, 9}, dtype, 3, -0.05, 0.05);
    RMSNormOutput implicit = rms_norm(x, {9}, std::nullopt);
    RMSNormOutput expl = rms_norm(x, {9}, std::nullopt, rms_norm_default_eps(dtype));
    testing::check_equal(implicit.y, expl.y, fmt::format("{} y", dtype_name(dtype)));
    const Reference ref = reference_forward(to_f64(x), 4, 9, {}, rms_norm_default_eps(dtype));
    testing::check_close(implicit.rstd, Shape{4}, ref.rstd,
                         testing::tolerance_for(dtype == kFloat64 ? kFloat64 : kFloat32),
                         fmt::format("{} rstd with the default eps", dtype_name(dtype)));
  }
}

TEST_CASE("rms_norm_backward equals the explicit Jacobian product", "[rms_norm][backward]") {
  uint64_t seed = 100;
  for (DType dtype : testing::kFloatDTypes) {
    for (const Case& k : cases()) {
      const int64_t n = shape_numel(k.normalized_shape);
      Tensor x = testing::random_tensor(k.shape, dtype, seed++, -3.0, 5.0);
      Tensor g = testing::random_tensor(k.shape, dtype, seed++);
      Tensor weight = testing::random_tensor(k.normalized_shape, dtype, seed++, 0.5, 2.0);
      for (bool affine : {false, true}) {
        const std::optional<Tensor> w = affine ? std::optional<Tensor>(weight) : std::nullopt;
        RMSNormOutput f = rms_norm(x, k.normalized_shape, w, 1e-6);
        const ReferenceGrads ref =
            reference_backward(to_f64(g), to_f64(x), f.rstd.numel(), n, values_or_empty(w), 1e-6);
        const std::string what = fmt::format("{} over {}, weight {}", describe(x), k.normalized_shape, affine);
        for (const Tensor& input : {x, testing::strided_copy(x)}) {
          RMSNormGrads grads = rms_norm_backward(testing::strided_copy(g), input, f.rstd, w);
          CHECK(grads.grad_x.shape() == x.shape());
          CHECK(grads.grad_weight.shape() == k.normalized_shape);
          testing::Tolerance tol = testing::tolerance_for(dtype);
          tol.atol *= 4;
          testing::check_close(grads.grad_x, x.shape(), ref.x, tol, "grad_x " + what);
          // grad_weight sums up to 3 rows of values up to ~2.
          tol.atol *= 2;
          testing::check_close(grads.grad_weight, k.normalized_shape, ref.w, tol, "grad_weight " + what);
        }
      }
    }
  }
}

TEST_CASE("rms_norm_backward agrees with a central finite difference of the float64 forward", "[rms_norm][backward]") {
  // loss = sum(g * rms_norm(x)); d loss / d x, w by (loss(+h) - loss(-h)) / 2h.
  const Shape shape{3, 2, 5};
  const Shape normalized{2, 5};
  Tensor x = testing::random_tensor(shape, kFloat64, 1, -2.0, 2.0);
  Tensor w = testing::random_tensor(normalized, kFloat64, 2, 0.5, 1.5);
  Tensor g = testing::random_tensor(shape, kFloat64, 4);
  const std::vector<double> gv = to_f64(g);
  auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv) {
    const Reference r = reference_forward(xv, 3, 10, wv, 1e-5);
    double s = 0.0;
    for (size_t i = 0; i < gv.size(); ++i) s += gv[i] * r.y[i];
    return s;
  };
  auto numeric = [&](int which) {
    std::vector<double> v[2] = {to_f64(x), to_f64(w)};
    std::vector<double> d(v[which].size());
    const double h = 1e-6;
    for (size_t i = 0; i < d.size(); ++i) {
      const double saved = v[which][i];
      v[which][i] = saved + h;
      const double up = loss(v[0], v[1]);
      v[which][i] = saved - h;
      const double down = loss(v[0], v[1]);
      v[which][i] = saved;
      d[i] = (up - down) / (2 * h);
    }
    return d;
  };
  RMSNormOutput f = rms_norm(x, normalized, w, 1e-5);
  RMSNormGrads grads = rms_norm_backward(g, x, f.rstd, w);
  const testing::Tolerance fd{1e-7, 1e-6};
  testing::check_close(grads.grad_x, shape, numeric(0), fd, "grad_x vs finite difference");
  testing::check_close(grads.grad_weight, normalized, numeric(1), fd, "grad_weight vs finite difference");
}

TEST_CASE("rms_norm of rows with exactly known mean squares is exact", "[rms_norm][exact]") {
  // Rows [2, -2, 2, -2] and [0, 0, 0, 4]: mean(x^2) = 4, rstd = 1/2 with eps 0, so
  // xhat = [1, -1, 1, -1] and [0, 0, 0, 2]. With grad_y = 1 and g = w = [2, 2, 0.5, 1]:
  //   mean(g * xhat) = -1/8 and 1/2, grad_x = rstd * (g - xhat * mean(g * xhat)),
  //   grad_weight = the sum of xhat over rows.
  const std::vector<double> xv{2, -2, 2, -2, 0, 0, 0, 4};
  for (DType dtype : testing::kFloatDTypes) {
    Tensor x = Tensor::from_vector(xv, {2, 4}).to(dtype);
    Tensor w = Tensor::from_vector(std::vector<double>{2, 2, 0.5, 1}).to(dtype);
    RMSNormOutput out = rms_norm(x, {4}, w, 0.0);
    testing::check_equal(out.y, Shape{2, 4}, {2, -2, 0.5, -1, 0, 0, 0, 2}, "y");
    testing::check_equal(out.rstd, Shape{2}, {0.5, 0.5}, "rstd");
    RMSNormGrads grads = rms_norm_backward(ones({2, 4}, dtype), x, out.rstd, w);
    testing::check_equal(grads.grad_weight, Shape{4}, {1, -1, 1, 1}, "grad_weight");
    testing::check_equal(grads.grad_x, Shape{2, 4}, {1.0625, 0.9375, 0.3125, 0.4375, 1, 1, 0.25, 0}, "grad_x");
  }
}

TEST_CASE("rms_norm_backward is bitwise the same on 1 and 2 threads", "[rms_norm][parallel]") {
  testing::ThreadCountGuard guard;
  Tensor x = testing::random_tensor({4097, 33}, kFloat32, 5);
  Tensor g = testing::random_tensor({4097, 33}, kFloat32, 6);
  Tensor w = testing::random_tensor({33}, kFloat32, 7);
  set_num_threads(1);
  RMSNormOutput f = rms_norm(x, {33}, w);
  RMSNormGrads one = rms_norm_backward(g, x, f.rstd, w);
  set_num_threads(2);
  RMSNormGrads two = rms_norm_backward(g, x, f.rstd, w);
  testing::check_equal(two.grad_x, one.grad_x, "grad_x");
  testing::check_equal(two.grad_weight, one.grad_weight, "grad_weight");
  testing::check_equal(rms_norm(x, {33}, w).y, f.y, "forward");
}

TEST_CASE("rms_norm rejects bad arguments with typed errors", "[rms_norm][errors]") {
  Tensor x = Tensor::empty({2, 3, 4});
  CHECK_THROWS_WITH(rms_norm(x, {3}, std::nullopt),
                    Catch::Contains("rms_norm") && Catch::Contains("[3]") && Catch::Contains("float32[2, 3, 4]"));
  CHECK_THROWS_AS(rms_norm(x, {}, std::nullopt), ValueError);
  CHECK_THROWS_AS(rms_norm(x, {1, 2, 3, 4}, std::nullopt), ValueError);
  CHECK_THROWS_WITH(rms_norm(x, {4}, Tensor::empty({3})), Catch::Contains("weight") && Catch::Contains("float32[3]"));
  CHECK_THROWS_AS(rms_norm(x, {4}, Tensor::empty({4}, kFloat64)), ValueError);
  for (double eps : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    CHECK_THROWS_AS(rms_norm(x, {4}, std::nullopt, eps), ValueError);
  }
  CHECK_THROWS_WITH(rms_norm(x, {4}, std::nullopt, -1.0), Catch::Contains("rms_norm: eps -1"));
  CHECK_THROWS_AS(rms_norm(Tensor::empty({2, 4}, kInt32), {4}, std::nullopt), TypeError);
  RMSNormOutput f = rms_norm(x, {4}, std::nullopt);
  CHECK_THROWS_WITH(rms_norm_backward(Tensor::empty({2, 3}), x, f.rstd, std::nullopt),
                    Catch::Contains("rms_norm_backward") && Catch::Contains("grad_y"));
  CHECK_THROWS_WITH(rms_norm_backward(x, x, f.rstd.to(kFloat64), std::nullopt),
                    Catch::Contains("rstd") && Catch::Contains("float64[2, 3]"));
  CHECK_THROWS_AS(rms_norm_backward(x, x, Tensor::empty({2, 3, 4}), std::nullopt), ValueError);
  CHECK_THROWS_AS(rms_norm_backward(x, x, f.rstd, Tensor::empty({3, 4})), ValueError);
}

}  // namespace
}  // namespace dtr
