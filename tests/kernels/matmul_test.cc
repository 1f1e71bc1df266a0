// matmul and bmm against float64 triple loops: every floating dtype, sizes 0/1/7/1023/4097
// in each of M, K, N, row-major, transposed and strided operands, batches with an expanded
// operand, 1 and 2 threads; a bit-exact case of small integers; no copies of transposed
// operands (counted by the allocator); typed errors naming both shapes. matmul_bias and
// matmul_bias_gelu bit for bit against matmul, add and gelu (tanh) in every dtype, layout
// and folded batch, and their errors. matmul_accumulate over K chunks of whole blocks bit
// for bit as one matmul's accumulator (float32, bfloat16, float16), and its errors.
#include "kernels/matmul.h"

#include <cmath>
#include <numbers>

#include "core/allocator.h"
#include "core/parallel.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "tests/kernels/check_bitwise.h"
#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::to_f64;

// c[i][j] = sum_k a[i][k] b[k][j], in float64, from row-major values.
std::vector<double> reference_mm(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k,
                                 int64_t n) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += a[i * k + p] * b[p * n + j];
      c[i * n + j] = s;
    }
  return c;
}

// The dtype's tolerance, with atol grown like the rounding error of a K-term sum.
testing::Tolerance matmul_tolerance(DType dtype, int64_t k) {
  testing::Tolerance t = testing::tolerance_for(dtype);
  t.atol *= std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)));
  return t;
}

enum class Operand { kContiguous, kTransposed, kStrided };
const Operand kOperands[] = {Operand::kContiguous, Operand::kTransposed, Operand::kStrided};

// A [rows, cols] operand with the values of `values` ([rows, cols]) in the given layout.
Tensor as_operand(const Tensor& values, Operand how) {
  switch (how) {
    case Operand::kContiguous: return values;
    case Operand::kTransposed: return values.t().contiguous().t();  // strides [1, rows]
    case Operand::kStrided: return testing::strided_copy(values);
  }
  return {};
}

struct MatmulShape {
  int64_t m, k, n;
};
const MatmulShape kShapes[] = {{0, 7, 5},    {7, 0, 5},    {7, 5, 0},    {1, 1, 1},    {7, 7, 7},   {1023, 7, 9},
                               {7, 1023, 9}, {9, 7, 1023}, {5, 4097, 3}, {4097, 3, 2}, {2, 3, 4097}};

TEST_CASE("matmul matches a float64 triple loop for every dtype, size and operand layout", "[matmul]") {
  uint64_t seed = 1;
  for (DType dtype : testing::kFloatDTypes) {
    for (MatmulShape s : kShapes) {
      Tensor a = testing::random_tensor({s.m, s.k}, dtype, seed++);
      Tensor b = testing::random_tensor({s.k, s.n}, dtype, seed++);
      // The reference multiplies the inputs as rounded to dtype.
      const std::vector<double> expected = reference_mm(to_f64(a), to_f64(b), s.m, s.k, s.n);
      for (Operand ha : kOperands) {
        for (Operand hb : kOperands) {
          Tensor c = matmul(as_operand(a, ha), as_operand(b, hb));
          REQUIRE(c.shape() == Shape{s.m, s.n});
          CHECK(c.dtype() == dtype);
          CHECK(c.is_contiguous());
          testing::check_close(c, Shape{s.m, s.n}, expected, matmul_tolerance(dtype, s.k),
                               fmt::format("matmul [{}, {}] x [{}, {}], layouts {} and {}", s.m, s.k, s.k, s.n,
                                           static_cast<int>(ha), static_cast<int>(hb)));
        }
      }
    }
  }
}

TEST_CASE("matmul of small integers is exact in every dtype", "[matmul][exact]") {
  // a [3, 4] and b [4, 2] of integers in [-4, 4]: every partial sum is an integer below 2^8.
  const std::vector<double> av{1, -2, 3, 4, 0, 2, -1, -3, 4, 4, -4, 1};
  const std::vector<double> bv{2, -1, 3, 0, -4, 1, 1, 2};
  const std::vector<double> expected = reference_mm(av, bv, 3, 4, 2);
  for (DType dtype : testing::kFloatDTypes) {
    Tensor a = Tensor::from_vector(av, {3, 4}).to(dtype);
    Tensor b = Tensor::from_vector(bv, {4, 2}).to(dtype);
    testing::check_equal(matmul(a, b), Shape{3, 2}, expected, "small integers");
    testing::check_equal(matmul(b.t(), a.t()), Tensor::from_vector(expected, {3, 2}).t(), "b^T a^T");
  }
}

TEST_CASE("transposed and row-major operands are multiplied without copies", "[matmul]") {
  Tensor a = testing::random_tensor({64, 48}, kFloat32, 1);
  Tensor b = testing::random_tensor({32, 48}, kFloat32, 2);  // used as b.t(): [48, 32]
  auto allocations = [](auto&& f) {
    const int64_t before = memory_stats(kCPU).total_allocs;
    f();
    return memory_stats(kCPU).total_allocs - before;
  };
  CHECK(allocations([&] { matmul(a, b.t()); }) == 1);  // the result only
  CHECK(allocations([&] { matmul(b, a.t()); }) == 1);
  CHECK(allocations([&] { matmul(a.narrow(1, 8, 16), b.narrow(1, 0, 16).t()); }) == 1);  // leading dim > cols
  CHECK(allocations([&] { matmul(testing::strided_copy(a), b.t()); }) >= 3);  // the view, its copy, the result
  Tensor a3 = a.unsqueeze(0).expand({3, 64, 48});
  CHECK(allocations([&] { bmm(a3, b.t().unsqueeze(0).expand({3, 48, 32})); }) == 1);
}

TEST_CASE("bmm matches per-batch float64 products, including expanded and transposed operands", "[matmul][bmm]") {
  uint64_t seed = 100;
  for (DType dtype : testing::kFloatDTypes) {
    for (int64_t batch : {0, 1, 3}) {
      for (MatmulShape s : {MatmulShape{7, 5, 3}, MatmulShape{1, 1023, 7}, MatmulShape{33, 7, 65}}) {
        Tensor a = testing::random_tensor({batch, s.m, s.k}, dtype, seed++);
        Tensor bt = testing::random_tensor({batch, s.n, s.k}, dtype, seed++);  // b = bt^T per batch
        Tensor b = bt.transpose(-1, -2);
        Tensor shared = testing::random_tensor({s.k, s.n}, dtype, seed++);  // one b for every batch
        std::vector<double> expected, expected_shared;
        for (int64_t i = 0; i < batch; ++i) {
          const std::vector<double> ai = to_f64(a.select(0, i));
          for (double v : reference_mm(ai, to_f64(b.select(0, i)), s.m, s.k, s.n)) expected.push_back(v);
          for (double v : reference_mm(ai, to_f64(shared), s.m, s.k, s.n)) expected_shared.push_back(v);
        }
        const auto tol = matmul_tolerance(dtype, s.k);
        const std::string what = fmt::format("bmm batch {} [{}, {}] x [{}, {}]", batch, s.m, s.k, s.k, s.n);
        Tensor c = bmm(a, b);
        REQUIRE(c.shape() == Shape{batch, s.m, s.n});
        testing::check_close(c, Shape{batch, s.m, s.n}, expected, tol, what + ", transposed b");
        testing::check_close(bmm(testing::strided_copy(a), b.contiguous()), Shape{batch, s.m, s.n}, expected, tol,
                             what + ", strided a");
        testing::check_close(bmm(a, shared.unsqueeze(0).expand({batch, s.k, s.n})), Shape{batch, s.m, s.n},
                             expected_shared, tol, what + ", expanded b");
      }
    }
  }
}

TEST_CASE("matmul and bmm give the same answers on 1 and 2 threads", "[matmul][parallel]") {
  testing::ThreadCountGuard guard;
  Tensor a = testing::random_tensor({256, 300}, kFloat32, 7);
  Tensor b = testing::random_tensor({300, 200}, kFloat32, 8);
  Tensor a3 = testing::random_tensor({4, 40, 30}, kFloat64, 9);
  Tensor b3 = testing::random_tensor({4, 30, 20}, kFloat64, 10);
  const std::vector<double> expected = reference_mm(to_f64(a), to_f64(b), 256, 300, 200);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    testing::check_close(matmul(a, b), Shape{256, 200}, expected, matmul_tolerance(kFloat32, 300),
                         fmt::format("{} threads", threads));
    testing::check_close(matmul(b.t(), a.t()), Tensor::from_vector(expected, {256, 200}).t(),
                         matmul_tolerance(kFloat32, 300), fmt::format("transposed, {} threads", threads));
    Tensor c3 = bmm(a3, b3);
    for (int64_t i = 0; i < 4; ++i) {
      testing::check_close(c3.select(0, i), Shape{40, 20},
                           reference_mm(to_f64(a3.select(0, i)), to_f64(b3.select(0, i)), 40, 30, 20), "bmm batch");
    }
  }
}

TEST_CASE("matmul_out and bmm_out overwrite the caller's tensor", "[matmul][out]") {
  for (DType dtype : testing::kFloatDTypes) {
    Tensor a = testing::random_tensor({7, 1023}, dtype, 21);
    Tensor b = testing::random_tensor({9, 1023}, dtype, 22);
    const std::vector<double> expected = reference_mm(to_f64(a), to_f64(b.t()), 7, 1023, 9);
    Tensor out = full({7, 9}, 123.0, dtype);  // stale values must not leak into the result
    const int64_t before = memory_stats(kCPU).total_allocs;
    CHECK(&matmul_out(out, a, b.t()) == &out);
    if (dtype == kFloat32 || dtype == kFloat64) CHECK(memory_stats(kCPU).total_allocs == before);
    testing::check_close(out, Shape{7, 9}, expected, matmul_tolerance(dtype, 1023), "matmul_out");
    Tensor out3 = full({2, 7, 9}, -5.0, dtype);
    bmm_out(out3, a.unsqueeze(0).expand({2, 7, 1023}), b.t().unsqueeze(0).expand({2, 1023, 9}));
    std::vector<double> twice = expected;
    twice.insert(twice.end(), expected.begin(), expected.end());
    testing::check_close(out3, Shape{2, 7, 9}, twice, matmul_tolerance(dtype, 1023), "bmm_out");
  }
  Tensor a = Tensor::empty({4, 4});
  CHECK_THROWS_WITH(matmul_out(a, a, Tensor::empty({4, 4})), Catch::Contains("shares storage"));
  CHECK_THROWS_WITH(matmul_out(Tensor::empty({4, 5}), a, Tensor::empty({4, 4})),
                    Catch::Contains("matmul_out") && Catch::Contains("float32[4, 5]") && Catch::Contains("[4, 4]"));
  CHECK_THROWS_AS(matmul_out(Tensor::empty({4, 8}).narrow(1, 0, 4), a, Tensor::empty({4, 4})), ValueError);
  CHECK_THROWS_AS(matmul_out(Tensor::empty({4, 4}, kFloat64), a, Tensor::empty({4, 4})), TypeError);
}

TEST_CASE("matmul_accumulate over K chunks of whole blocks is one matmul bit for bit", "[matmul][accumulate]") {
  // A weight gradient x^T g summed over row chunks: a = x^T (a transposed view), b = g.
  for (DType dtype : {kFloat32, kBFloat16, kFloat16}) {
    const int64_t block = matmul_k_block(dtype);
    const int64_t rows = 3 * block + 37, m = 33, n = 65;  // a partial last chunk
    const Tensor x = testing::random_tensor({rows, m}, dtype, 41);
    const Tensor g = testing::random_tensor({rows, n}, dtype, 42);
    const Tensor whole = matmul(x.t(), g);
    for (int64_t chunk : {block, 2 * block}) {
      INFO("dtype " << dtype_name(dtype) << ", chunks of " << chunk << " rows");
      const Tensor acc = zeros({m, n}, kFloat32);
      for (int64_t begin = 0; begin < rows; begin += chunk) {
        const int64_t len = std::min(chunk, rows - begin);
        matmul_accumulate(acc, x.narrow(0, begin, len).t(), g.narrow(0, begin, len));
      }
      testing::check_bitwise(acc.to(dtype), whole, "chunked accumulation");
    }
  }
  // float64 accumulates too (no bitwise promise): within rounding.
  const Tensor a = testing::random_tensor({5, 300}, kFloat64, 43), b = testing::random_tensor({300, 6}, kFloat64, 44);
  const Tensor acc = full({5, 6}, 1.0, kFloat64);
  matmul_accumulate(acc, a.narrow(1, 0, 100), b.narrow(0, 0, 100));
  matmul_accumulate(acc, a.narrow(1, 100, 200), b.narrow(0, 100, 200));
  std::vector<double> expected = reference_mm(to_f64(a), to_f64(b), 5, 300, 6);
  for (double& v : expected) v += 1.0;
  testing::check_close(acc, Shape{5, 6}, expected, matmul_tolerance(kFloat64, 300), "float64 accumulation");
}

TEST_CASE("matmul_accumulate rejects an accumulator of the wrong dtype, shape or layout",
          "[matmul][accumulate][errors]") {
  const Tensor a = Tensor::empty({4, 3}, kBFloat16), b = Tensor::empty({3, 5}, kBFloat16);
  CHECK_THROWS_AS(matmul_accumulate(Tensor::empty({4, 5}, kBFloat16), a, b), TypeError);
  CHECK_THROWS_WITH(matmul_accumulate(Tensor::empty({4, 5}, kBFloat16), a, b),
                    Catch::Contains("bfloat16[4, 5]") && Catch::Contains("float32"));
  CHECK_THROWS_WITH(matmul_accumulate(Tensor::empty({5, 4}), a, b), Catch::Contains("[4, 5]"));
  CHECK_THROWS_AS(matmul_accumulate(Tensor::empty({4, 10}).narrow(1, 0, 5), a, b), ValueError);
  const Tensor f = Tensor::empty({4, 4});
  CHECK_THROWS_WITH(matmul_accumulate(f, f, Tensor::empty({4, 4})), Catch::Contains("shares storage"));
}

// The composition matmul_bias fuses: matmul, add, then (kBiasGeluTanh) gelu's tanh form.
Tensor composed_matmul_bias(const Tensor& a, const Tensor& b, const Tensor& bias, MatmulEpilogue epilogue) {
  Shape shape = a.shape();
  shape.back() = b.size(1);
  const Tensor rows = a.dim() == 2 ? a : a.reshape({a.numel() / a.size(-1), a.size(-1)});
  const Tensor pre = add(matmul(rows, b), bias).view(shape);
  return epilogue == MatmulEpilogue::kBias ? pre : gelu(pre, GeluApproximation::kTanh);
}

TEST_CASE("matmul_bias is matmul, add and gelu (tanh) bit for bit in every dtype, size and layout",
          "[matmul][matmul_bias]") {
  uint64_t seed = 300;
  for (DType dtype : testing::kFloatDTypes) {
    for (MatmulShape s : {MatmulShape{0, 7, 5}, MatmulShape{7, 0, 5}, MatmulShape{7, 5, 0}, MatmulShape{1, 1, 1},
                          MatmulShape{33, 17, 9}, MatmulShape{7, 1023, 9}, MatmulShape{1023, 7, 13}}) {
      const Tensor a = testing::random_tensor({s.m, s.k}, dtype, seed++, -2.0, 2.0);
      const Tensor b = testing::random_tensor({s.k, s.n}, dtype, seed++);
      const Tensor bias = testing::random_tensor({s.n}, dtype, seed++, -3.0, 3.0);
      for (Operand ha : kOperands) {
        for (Operand hb : kOperands) {
          const Tensor x = as_operand(a, ha), w = as_operand(b, hb);
          const std::string what = fmt::format("{} [{}, {}] x [{}, {}] + [{}], layouts {} and {}", dtype_name(dtype),
                                               s.m, s.k, s.k, s.n, s.n, static_cast<int>(ha), static_cast<int>(hb));
          const Tensor biased = matmul_bias(x, w, bias);
          REQUIRE(biased.shape() == Shape{s.m, s.n});
          CHECK(biased.dtype() == dtype);
          CHECK(biased.is_contiguous());
          testing::check_equal(biased, composed_matmul_bias(x, w, bias, MatmulEpilogue::kBias), what + ", bias");
          const Tensor expected_gelu = composed_matmul_bias(x, w, bias, MatmulEpilogue::kBiasGeluTanh);
          testing::check_equal(matmul_bias(x, w, bias, MatmulEpilogue::kBiasGeluTanh), expected_gelu,
                               what + ", bias + gelu");
          const MatmulBiasGelu fused = matmul_bias_gelu(x, w, bias);
          REQUIRE(fused.pre.shape() == Shape{s.m, s.n});
          testing::check_equal(fused.out, expected_gelu, what + ", matmul_bias_gelu out");
          testing::check_equal(fused.pre, biased, what + ", matmul_bias_gelu pre");
        }
      }
    }
  }
}

TEST_CASE("matmul_bias folds a's leading dims into M", "[matmul][matmul_bias]") {
  for (DType dtype : testing::kFloatDTypes) {
    const Tensor a = testing::random_tensor({2, 3, 5, 7}, dtype, 401);
    const Tensor w = testing::random_tensor({9, 7}, dtype, 402);  // b = w^T, as linear passes it
    const Tensor bias = testing::random_tensor({9}, dtype, 403);
    for (const Tensor& x : {a, testing::strided_copy(a), a.transpose(1, 2).contiguous().transpose(1, 2)}) {
      const Tensor y = matmul_bias(x, w.t(), bias);
      REQUIRE(y.shape() == Shape{2, 3, 5, 9});
      testing::check_equal(y, composed_matmul_bias(x, w.t(), bias, MatmulEpilogue::kBias), "folded batch");
      const MatmulBiasGelu g = matmul_bias_gelu(x, w.t(), bias);
      REQUIRE(g.out.shape() == Shape{2, 3, 5, 9});
      REQUIRE(g.pre.shape() == Shape{2, 3, 5, 9});
      testing::check_equal(g.out, composed_matmul_bias(x, w.t(), bias, MatmulEpilogue::kBiasGeluTanh),
                           "folded batch, gelu");
      testing::check_equal(g.pre, y, "folded batch, pre");
    }
  }
}

TEST_CASE("matmul_bias of small integers is exact, and its GELU is the tanh form", "[matmul][matmul_bias][exact]") {
  const std::vector<double> av{1, -2, 3, 4, 0, 2, -1, -3, 4, 4, -4, 1};
  const std::vector<double> bv{2, -1, 3, 0, -4, 1, 1, 2};
  const std::vector<double> biasv{-3, 5};
  std::vector<double> expected = reference_mm(av, bv, 3, 4, 2);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += biasv[i % 2];
  for (DType dtype : testing::kFloatDTypes) {
    const Tensor a = Tensor::from_vector(av, {3, 4}).to(dtype);
    const Tensor b = Tensor::from_vector(bv, {4, 2}).to(dtype);
    const Tensor bias = Tensor::from_vector(biasv, {2}).to(dtype);
    testing::check_equal(matmul_bias(a, b, bias), Shape{3, 2}, expected, "small integers + bias");
  }
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) on the exact sums, not the erf form.
  const Tensor a = Tensor::from_vector(av, {3, 4}), b = Tensor::from_vector(bv, {4, 2});
  std::vector<double> tanh_form, erf_form;
  for (double x : expected) {
    tanh_form.push_back(0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x))));
    erf_form.push_back(0.5 * x * (1 + std::erf(x / std::sqrt(2.0))));
  }
  const Tensor y = matmul_bias(a.to(kFloat64), b.to(kFloat64), Tensor::from_vector(biasv, {2}).to(kFloat64),
                               MatmulEpilogue::kBiasGeluTanh);
  testing::check_close(y, Shape{3, 2}, tanh_form, {1e-14, 1e-14}, "gelu tanh of small integers");
  CHECK(to_f64(y) != erf_form);
}

TEST_CASE("matmul_bias rejects bad operands with errors naming all three", "[matmul][matmul_bias][errors]") {
  const Tensor a = Tensor::empty({2, 3}), b = Tensor::empty({3, 4}), bias = Tensor::empty({4});
  CHECK_THROWS_MATCHES(matmul_bias(a, b, Tensor::empty({3})), ValueError,
                       testing::MessageContains("matmul_bias: operands float32[2, 3] and float32[3, 4] with bias "
                                                "float32[3] do not fit") &&
                           testing::MessageContains("legal: a [*, M, K], b [K, N], bias [N]"));
  CHECK_THROWS_AS(matmul_bias(a, Tensor::empty({4, 4}), bias), ValueError);
  CHECK_THROWS_AS(matmul_bias(a, b, Tensor::empty({1, 4})), ValueError);
  CHECK_THROWS_AS(matmul_bias(Tensor::empty({3}), b, bias), ValueError);
  CHECK_THROWS_AS(matmul_bias(a, b.unsqueeze(0), bias), ValueError);
  CHECK_THROWS_MATCHES(matmul_bias(a, b, Tensor::empty({4}, kFloat64)), TypeError,
                       testing::MessageContains("matmul_bias: bias float64[4] differs in dtype"));
  CHECK_THROWS_AS(matmul_bias(a, Tensor::empty({3, 4}, kFloat64), bias), TypeError);
  CHECK_THROWS_AS(matmul_bias(Tensor::empty({2, 3}, kInt64), Tensor::empty({3, 4}, kInt64), Tensor::empty({4}, kInt64)),
                  TypeError);
  CHECK_THROWS_MATCHES(matmul_bias_gelu(a, b, Tensor::empty({5})), ValueError,
                       testing::MessageContains("matmul_bias_gelu:"));
}

TEST_CASE("matmul and bmm reject bad operands with errors naming both", "[matmul][errors]") {
  Tensor a = Tensor::empty({2, 3});
  Tensor b = Tensor::empty({4, 5});
  CHECK_THROWS_AS(matmul(a, b), ValueError);
  CHECK_THROWS_WITH(matmul(a, b), Catch::Contains("matmul") && Catch::Contains("[2, 3]") && Catch::Contains("[4, 5]"));
  CHECK_THROWS_WITH(matmul(a, Tensor::empty({3})), Catch::Contains("2-D") && Catch::Contains("float32[3]"));
  CHECK_THROWS_AS(matmul(a, Tensor::empty({3, 2}, kFloat64)), TypeError);
  CHECK_THROWS_WITH(matmul(a, Tensor::empty({3, 2}, kFloat64)),
                    Catch::Contains("float32[2, 3]") && Catch::Contains("float64[3, 2]"));
  CHECK_THROWS_AS(matmul(Tensor::empty({2, 3}, kInt64), Tensor::empty({3, 2}, kInt64)), TypeError);
  CHECK_THROWS_WITH(bmm(Tensor::empty({2, 3, 4}), Tensor::empty({3, 4, 5})),
                    Catch::Contains("bmm") && Catch::Contains("[2, 3, 4]") && Catch::Contains("[3, 4, 5]"));
  CHECK_THROWS_AS(bmm(Tensor::empty({2, 3, 4}), Tensor::empty({2, 5, 5})), ValueError);
  CHECK_THROWS_WITH(bmm(a, b), Catch::Contains("3-D"));
}

}  // namespace
}  // namespace dtr
