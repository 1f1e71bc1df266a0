// The CPU GEMM (kernels/cpu/gemm.h) on every path this host has, each against a float64
// reference: ~40 shapes (odd sizes around the tile widths and the reference model's
// shapes), K = 0, every transpose layout with padded leading dims, batches with stride-0
// operands, beta 0 and 1, alpha, the bias epilogue; float32 and bfloat16 inputs (whose
// products are exact in float32, so both take the float32 summation bound). Bitwise: a case
// of small integers with an exact answer, and the summation-order invariant (the same bits
// for any thread count and for any sub-block of C computed alone). Paths above the host's
// warn SKIPPED. Also DTR_CPU_ISA's parsing.
#include "kernels/cpu/gemm.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/kernels/thread_count_guard.h"

namespace dtr::cpu {
namespace {

constexpr CpuIsa kAllIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16, CpuIsa::kAmx};

// The paths this host runs; warns SKIPPED for the others.
std::vector<CpuIsa> host_isas() {
  std::vector<CpuIsa> isas;
  for (const CpuIsa isa : kAllIsas) {
    if (isa <= detected_cpu_isa()) {
      isas.push_back(isa);
    } else {
      WARN("SKIPPED: path " << cpu_isa_name(isa) << " (this CPU supports up to " << cpu_isa_name(detected_cpu_isa())
                            << ")");
    }
  }
  return isas;
}

enum class Layout { kRowMajor, kTransposed };

// One operand of `batch` rows x cols matrices, stored in a layout with `pad` extra elements
// per leading dim; batch_stride 0 shares one matrix.
template <class T>
struct Operand {
  int64_t rows, cols;
  Layout layout;
  int64_t ld, batch_stride;
  std::vector<T> storage;

  Operand(int64_t batch, int64_t r, int64_t c, Layout l, int64_t pad, bool shared, uint64_t seed)
      : rows(r), cols(c), layout(l), ld((l == Layout::kRowMajor ? c : r) + pad) {
    const int64_t one = (l == Layout::kRowMajor ? r : c) * ld;
    batch_stride = shared ? 0 : one;
    storage.resize(static_cast<size_t>(std::max<int64_t>(shared ? one : batch * one, 1)));
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (T& v : storage) v = T(dist(gen));
  }
  int64_t row_stride() const { return layout == Layout::kRowMajor ? ld : 1; }
  int64_t col_stride() const { return layout == Layout::kRowMajor ? 1 : ld; }
  double at(int64_t b, int64_t i, int64_t j) const {
    return static_cast<float>(storage[b * batch_stride + i * row_stride() + j * col_stride()]);
  }
  GemmMatrix<const T> matrix() const { return {storage.data(), row_stride(), col_stride(), batch_stride}; }
};

struct Case {
  int64_t batch = 1, m = 1, n = 1, k = 1;
  Layout la = Layout::kRowMajor, lb = Layout::kRowMajor;
  int64_t pad = 0;  // extra elements per leading dim of A, B and C
  bool shared_a = false, shared_b = false;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
};

std::string describe(const Case& c, CpuIsa isa, const char* dtype) {
  return fmt::format("gemm {} {} batch {} m {} n {} k {} A {} B {} pad {} shared {}/{} alpha {} beta {} bias {}",
                     cpu_isa_name(isa), dtype, c.batch, c.m, c.n, c.k, c.la == Layout::kRowMajor ? "row" : "transposed",
                     c.lb == Layout::kRowMajor ? "row" : "transposed", c.pad, c.shared_a, c.shared_b, c.alpha, c.beta,
                     c.bias);
}

// Runs c on each path against float64; large products check a sample of rows.
template <class T>
void check_case(const Case& c, const std::vector<CpuIsa>& isas, const char* dtype, uint64_t seed) {
  const Operand<T> a(c.batch, c.m, c.k, c.la, c.pad, c.shared_a, seed);
  const Operand<T> b(c.batch, c.k, c.n, c.lb, c.pad, c.shared_b, seed + 1);
  const int64_t ldc = c.n + c.pad;
  std::vector<float> c0(static_cast<size_t>(c.batch * c.m * ldc)), bias(static_cast<size_t>(c.n));
  std::mt19937_64 gen(seed + 2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : c0) v = dist(gen);
  for (float& v : bias) v = dist(gen);
  // Large products check every 37th row and the last.
  std::vector<int64_t> rows;
  const int64_t row_step = c.m * c.n * c.k > (int64_t{1} << 24) ? 37 : 1;
  for (int64_t i = 0; i < c.m; i += row_step) rows.push_back(i);
  if (rows.back() != c.m - 1) rows.push_back(c.m - 1);
  for (const CpuIsa isa : isas) {
    std::vector<float> out = c0;
    gemm(c.batch, c.m, c.n, c.k, a.matrix(), b.matrix(), GemmMatrix<float>{out.data(), ldc, 1, c.m * ldc},
         {.alpha = c.alpha, .beta = c.beta, .bias = c.bias ? bias.data() : nullptr, .isa = isa});
    int64_t bad = 0;
    std::string first;
    for (int64_t bi = 0; bi < c.batch; ++bi) {
      for (const int64_t i : rows) {
        for (int64_t j = 0; j < ldc; ++j) {
          const size_t at = static_cast<size_t>((bi * c.m + i) * ldc + j);
          if (j >= c.n) {  // padding: untouched
            if (out[at] != c0[at]) ++bad;
            continue;
          }
          double sum = 0, magnitude = 0;
          for (int64_t p = 0; p < c.k; ++p) {
            sum += a.at(bi, i, p) * b.at(bi, p, j);
            magnitude += std::abs(a.at(bi, i, p) * b.at(bi, p, j));
          }
          const double beta_c = c.beta != 0 ? double{c.beta} * c0[at] : 0.0;
          const double bias_j = c.bias ? double{bias[j]} : 0.0;
          const double want = double{c.alpha} * sum + beta_c + bias_j;
          // float32 summation: at most (k + 3) roundings of the magnitudes involved.
          const double tol = static_cast<double>(c.k + 3) * std::ldexp(1.0, -23) *
                                 (std::abs(double{c.alpha}) * magnitude + std::abs(beta_c) + std::abs(bias_j)) +
                             1e-30;
          if (!(std::abs(out[at] - want) <= tol)) {
            if (bad++ == 0)
              first = fmt::format("[{}, {}, {}]: got {}, want {} (tolerance {})", bi, i, j, out[at], want, tol);
          }
        }
      }
    }
    INFO(describe(c, isa, dtype) << ": " << bad << " mismatches, first " << first);
    CHECK(bad == 0);
  }
}

void check_both(const Case& c, uint64_t seed) {
  const std::vector<CpuIsa> isas = host_isas();
  check_case<float>(c, {isas.begin(), isas.begin() + std::min<size_t>(isas.size(), 3)}, "float32", seed);
  check_case<BFloat16>(c, isas, "bfloat16", seed);
}

TEST_CASE("gemm matches float64 over the shape list on every path") {
  const int64_t sizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 129, 255, 257, 300};
  uint64_t seed = 1;
  for (size_t s = 0; s < std::size(sizes); ++s) {
    const int64_t x = sizes[s], y = sizes[(s + 5) % std::size(sizes)], z = sizes[(s + 11) % std::size(sizes)];
    // Each size as m, n and k (square), and in a mixed triple; layouts and beta rotate.
    check_both({.m = x,
                .n = x,
                .k = x,
                .la = s % 2 ? Layout::kTransposed : Layout::kRowMajor,
                .lb = s % 4 >= 2 ? Layout::kTransposed : Layout::kRowMajor,
                .pad = int64_t(s % 3),
                .beta = 0.0f},
               seed++);
    check_both({.m = x,
                .n = y,
                .k = z,
                .la = s % 4 >= 2 ? Layout::kTransposed : Layout::kRowMajor,
                .lb = s % 2 ? Layout::kTransposed : Layout::kRowMajor,
                .pad = 1,
                .beta = 1.0f},
               seed++);
  }
  // The reference model's products (tokens 1024, dim 256, ffn 1024, vocab 4096): forward
  // x W^T, the input gradient dy W and the weight gradient dy^T x.
  struct Model {
    int64_t m, n, k;
    Layout la, lb;
  };
  for (const Model& s : {Model{1024, 768, 256, Layout::kRowMajor, Layout::kTransposed},
                         Model{1024, 1024, 256, Layout::kRowMajor, Layout::kTransposed},
                         Model{1024, 256, 1024, Layout::kRowMajor, Layout::kRowMajor},
                         Model{1024, 4096, 256, Layout::kRowMajor, Layout::kTransposed},
                         Model{1024, 256, 4096, Layout::kRowMajor, Layout::kRowMajor},
                         Model{256, 1024, 1024, Layout::kTransposed, Layout::kRowMajor},
                         Model{4096, 256, 1024, Layout::kTransposed, Layout::kRowMajor}}) {
    check_both({.m = s.m, .n = s.n, .k = s.k, .la = s.la, .lb = s.lb}, seed++);
  }
}

TEST_CASE("gemm: every transpose layout, padded leading dims, alpha, beta and bias") {
  uint64_t seed = 100;
  for (const Layout la : {Layout::kRowMajor, Layout::kTransposed}) {
    for (const Layout lb : {Layout::kRowMajor, Layout::kTransposed}) {
      for (const int64_t pad : {0, 5}) {
        for (const float beta : {0.0f, 1.0f, -0.5f}) {
          for (const bool bias : {false, true}) {
            check_both({.m = 37,
                        .n = 45,
                        .k = 70,
                        .la = la,
                        .lb = lb,
                        .pad = pad,
                        .alpha = pad ? 0.5f : 1.0f,
                        .beta = beta,
                        .bias = bias},
                       seed++);
          }
        }
      }
    }
  }
  // K beyond one K block (float32 and bfloat16), with beta and the bias on the last block.
  check_both({.m = 29, .n = 70, .k = 1100, .lb = Layout::kTransposed, .beta = 1.0f, .bias = true}, seed++);
}

TEST_CASE("gemm with K = 0 gives beta C + bias") {
  check_both({.m = 5, .n = 40, .k = 0, .pad = 2, .beta = 1.0f, .bias = true}, 7);
  check_both({.m = 5, .n = 40, .k = 0, .beta = 0.0f}, 8);
}

TEST_CASE("gemm over batches with stride-0 operands") {
  uint64_t seed = 200;
  for (const bool shared_a : {false, true}) {
    for (const bool shared_b : {false, true}) {
      check_both({.batch = 3,
                  .m = 33,
                  .n = 20,
                  .k = 65,
                  .la = Layout::kTransposed,
                  .pad = 1,
                  .shared_a = shared_a,
                  .shared_b = shared_b,
                  .beta = 1.0f},
                 seed++);
    }
  }
  check_both({.batch = 32, .m = 128, .n = 128, .k = 64, .lb = Layout::kTransposed}, seed++);  // attention-like
}

TEST_CASE("gemm of small integers is exact on every path") {
  // |values| <= 4 and k = 300: every partial sum is an integer below 2^24, exact in float32.
  const int64_t m = 45, n = 70, k = 300;
  std::vector<float> a(m * k), b(k * n), want(m * n, 0.0f);
  for (int64_t i = 0; i < m * k; ++i) a[i] = static_cast<float>(i * 7 % 9) - 4.0f;
  for (int64_t i = 0; i < k * n; ++i) b[i] = static_cast<float>(i * 5 % 9) - 4.0f;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) want[i * n + j] += a[i * k + p] * b[p * n + j];
  std::vector<BFloat16> a16(a.begin(), a.end()), b16(b.begin(), b.end());
  const std::vector<CpuIsa> isas = host_isas();
  for (const CpuIsa isa : isas) {
    std::vector<float> out(m * n), out16(m * n);
    if (isa <= CpuIsa::kAvx512) {
      gemm(1, m, n, k, GemmMatrix<const float>{a.data(), k, 1, 0}, GemmMatrix<const float>{b.data(), n, 1, 0},
           GemmMatrix<float>{out.data(), n, 1, 0}, {.isa = isa});
      CHECK(out == want);
    }
    gemm(1, m, n, k, GemmMatrix<const BFloat16>{a16.data(), k, 1, 0}, GemmMatrix<const BFloat16>{b16.data(), n, 1, 0},
         GemmMatrix<float>{out16.data(), n, 1, 0}, {.isa = isa});
    INFO(cpu_isa_name(isa));
    CHECK(out16 == want);
  }
}

// C computed whole on `threads` threads, and the block [i0, i1) x [j0, j1) computed alone.
template <class T>
void check_invariance(CpuIsa isa, const char* dtype) {
  const int64_t m = 150, n = 300, k = 1100;  // several K blocks of both dtypes
  const Operand<T> a(1, m, k, Layout::kRowMajor, 0, false, 11), b(1, k, n, Layout::kTransposed, 0, false, 12);
  std::vector<float> bias(n, 0.25f);
  auto full = [&](int threads) {
    set_num_threads(threads);
    std::vector<float> out(m * n, 1.0f);
    gemm(1, m, n, k, a.matrix(), b.matrix(), GemmMatrix<float>{out.data(), n, 1, 0},
         {.beta = 1.0f, .bias = bias.data(), .isa = isa});
    return out;
  };
  const std::vector<float> one = full(1);
  INFO(cpu_isa_name(isa) << " " << dtype);
  CHECK(full(2) == one);
  CHECK(full(3) == one);
  set_num_threads(2);
  const int64_t i0 = 17, i1 = 61, j0 = 33, j1 = 250;
  std::vector<float> part((i1 - i0) * (j1 - j0), 1.0f);
  const T* pa = a.storage.data() + i0 * a.row_stride();
  const T* pb = b.storage.data() + j0 * b.col_stride();
  gemm(1, i1 - i0, j1 - j0, k, GemmMatrix<const T>{pa, a.row_stride(), 1, 0}, GemmMatrix<const T>{pb, 1, b.ld, 0},
       GemmMatrix<float>{part.data(), j1 - j0, 1, 0}, {.beta = 1.0f, .bias = bias.data() + j0, .isa = isa});
  int64_t differ = 0;
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = j0; j < j1; ++j) differ += part[(i - i0) * (j1 - j0) + (j - j0)] != one[i * n + j];
  CHECK(differ == 0);
}

TEST_CASE("gemm's bits depend on neither the thread count nor the block of C") {
  const testing::ThreadCountGuard guard;
  for (const CpuIsa isa : host_isas()) {
    if (isa <= CpuIsa::kAvx512) check_invariance<float>(isa, "float32");
    check_invariance<BFloat16>(isa, "bfloat16");
  }
}

TEST_CASE("DTR_CPU_ISA names a path no higher than the CPU's") {
  CHECK(parse_cpu_isa("avx2", CpuIsa::kAmx) == CpuIsa::kAvx2);
  CHECK(parse_cpu_isa("scalar", CpuIsa::kScalar) == CpuIsa::kScalar);
  CHECK(parse_cpu_isa("amx", CpuIsa::kAmx) == CpuIsa::kAmx);
  CHECK_THROWS_WITH(parse_cpu_isa("avx512", CpuIsa::kAvx2), Catch::Contains("lacks") && Catch::Contains("avx2"));
  CHECK_THROWS_WITH(parse_cpu_isa("sse9", CpuIsa::kAvx512), Catch::Contains("legal: scalar, avx2"));
  CHECK(cpu_isa() <= detected_cpu_isa());
}

}  // namespace
}  // namespace dtr::cpu
