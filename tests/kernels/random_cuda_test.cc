// The CUDA random fills (kernels/cuda/random.h) against the CPU kernels: uniform_ and
// bernoulli bit for bit at sizes 1, 7, 1023, 4097 and [8, 128, 256] in every dtype, into
// strided, transposed and offset views, and ShardLayout shards equal to slices of the whole
// draw (on the GPU, and to the CPU's shard). normal_ is compared within the error of CUDA's
// log, cos and sin against glibc's: float64 within 8 ulp of double in z (|dv| <= 8 eps
// |v - mean| + 2 eps |v|), each other dtype within one ulp of its own at the CPU's value,
// and at most one element in 1000 not bitwise equal (a 1-8 ulp double difference crosses
// a float32 rounding boundary with probability ~2^-26). Tagged gpu (Bazel) and [gpu]
// (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "kernels/fill.h"
#include "kernels/random.h"
#include "tests/kernels/check_bitwise.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_bitwise;
using testing::to_f64;

const Device kGpu(kCUDA, 0);
constexpr uint64_t kSeed = 0x0123456789abcdefull;  // both halves of the Philox key non-zero

const std::vector<Shape> kShapes = {{1}, {7}, {1023}, {4097}, {8, 128, 256}};

enum class Generator { kUniform, kNormal, kBernoulli };
constexpr Generator kGenerators[] = {Generator::kUniform, Generator::kNormal, Generator::kBernoulli};
const char* generator_name(Generator g) {
  return g == Generator::kUniform ? "uniform_" : g == Generator::kNormal ? "normal_" : "bernoulli";
}

// A fresh draw of shape and dtype on device (uniform in [-2, 3), normal (0.5, 2), p = 0.3).
Tensor draw(Generator g, Shape shape, DType dtype, uint64_t seed, Device device,
            const std::optional<ShardLayout>& layout = {}) {
  switch (g) {
    case Generator::kUniform: {
      Tensor t = Tensor::empty(shape, dtype, device);
      return uniform_(t, -2.0, 3.0, seed, layout);
    }
    case Generator::kNormal: {
      Tensor t = Tensor::empty(shape, dtype, device);
      return normal_(t, 0.5, 2.0, seed, layout);
    }
    case Generator::kBernoulli: return bernoulli(shape, 0.3, seed, dtype, layout, device);
  }
  return {};
}

// Units in the last place of dtype d at magnitude |v| (v finite).
double ulp_of(DType d, double v) {
  const int bits = d == kFloat64 ? 53 : d == kFloat32 ? 24 : d == kBFloat16 ? 8 : 11;
  const int min_exp = d == kFloat64 ? -1021 : d == kFloat32 ? -125 : d == kBFloat16 ? -125 : -13;
  int e = 0;
  std::frexp(v, &e);  // |v| = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, std::max(e, min_exp) - bits);
}

// normal_ on the GPU against the CPU's (mean and std of both draws given).
void check_normal(const Tensor& gpu, const Tensor& cpu, double mean, const std::string& what) {
  INFO(what << ": " << describe(gpu));
  REQUIRE(gpu.shape() == cpu.shape());
  const std::vector<double> g = to_f64(gpu), c = to_f64(cpu);
  constexpr double kEps = 0x1.0p-52;
  int64_t outside = 0, differ = 0;
  std::string first;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] == c[i]) continue;
    ++differ;
    const double tol = gpu.dtype() == kFloat64 ? 8 * kEps * std::abs(c[i] - mean) + 2 * kEps * std::abs(c[i])
                                               : ulp_of(gpu.dtype(), std::max(std::abs(c[i]), std::abs(g[i])));
    if (std::abs(g[i] - c[i]) <= tol) continue;
    if (++outside <= 5) first += fmt::format("\n  [flat {}] cpu {:.17g}, gpu {:.17g}", i, c[i], g[i]);
  }
  INFO(outside << " of " << g.size() << " elements outside the tolerance, " << differ << " not bitwise equal" << first);
  CHECK(outside == 0);
  if (gpu.dtype() != kFloat64) CHECK(differ <= static_cast<int64_t>(g.size()) / 1000);
}

TEST_CASE("CUDA uniform_ and bernoulli equal the CPU's bit for bit", "[gpu]") {
  for (const Shape& shape : kShapes) {
    for (DType d : testing::kFloatDTypes) {
      // Bounds whose lo + (hi - lo) u rounds differently with and without a fused multiply-add.
      for (auto [lo, hi] : std::vector<std::pair<double, double>>{{0, 1}, {-2, 3}, {0.1, 0.7}, {-1e-3, 1e5}}) {
        const std::string what = fmt::format("uniform_ [{}, {}) of {}{}", lo, hi, dtype_name(d), shape);
        Tensor c = Tensor::empty(shape, d), g = Tensor::empty(shape, d, kGpu);
        uniform_(c, lo, hi, kSeed);
        uniform_(g, lo, hi, kSeed);
        check_bitwise(g, c, what);
      }
    }
    for (DType d : testing::kAllDTypes) {
      for (double p : {0.0, 0.3, 0.5, 1.0}) {
        check_bitwise(bernoulli(shape, p, kSeed, d, std::nullopt, kGpu), bernoulli(shape, p, kSeed, d),
                      fmt::format("bernoulli p = {} of {}{}", p, dtype_name(d), shape));
      }
    }
  }
}

TEST_CASE("CUDA normal_ equals the CPU's within the error of the device's log, cos and sin", "[gpu]") {
  for (const Shape& shape : kShapes) {
    for (DType d : testing::kFloatDTypes) {
      for (auto [mean, sd] : std::vector<std::pair<double, double>>{{0, 1}, {0.5, 2}, {-3, 0.02}}) {
        Tensor c = Tensor::empty(shape, d), g = Tensor::empty(shape, d, kGpu);
        normal_(c, mean, sd, kSeed);
        normal_(g, mean, sd, kSeed);
        check_normal(g, c, mean, fmt::format("normal_ ({}, {}) of {}{}", mean, sd, dtype_name(d), shape));
      }
    }
  }
}

TEST_CASE("CUDA random fills into strided, transposed and offset views", "[gpu]") {
  for (Generator gen : {Generator::kUniform, Generator::kNormal}) {
    for (DType d : testing::kFloatDTypes) {
      const std::string what = fmt::format("{} of {}", generator_name(gen), dtype_name(d));
      INFO(what);
      // Each view of a zeroed [33, 40] buffer: untouched elements stay 0 on both devices.
      const auto views = [](const Tensor& buffer) {
        return std::vector<Tensor>{buffer.slice(1, 0, 40, 2), buffer.t(), buffer.narrow(0, 3, 7).narrow(1, 5, 33),
                                   buffer.slice(0, 1, 33, 3).t()};
      };
      for (size_t v = 0; v < 4; ++v) {
        const Tensor bc = zeros({33, 40}, d), bg = zeros({33, 40}, d, kGpu);
        Tensor vc = views(bc)[v], vg = views(bg)[v];
        if (gen == Generator::kUniform) {
          uniform_(vc, -2.0, 3.0, kSeed);
          uniform_(vg, -2.0, 3.0, kSeed);
          check_bitwise(bg, bc, fmt::format("{} into view {}", what, v));
        } else {
          normal_(vc, 0.5, 2.0, kSeed);
          normal_(vg, 0.5, 2.0, kSeed);
          check_normal(bg, bc, 0.5, fmt::format("{} into view {}", what, v));
        }
      }
    }
  }
}

TEST_CASE("CUDA shards drawn with their layout equal slices of the whole draw", "[gpu]") {
  for (Generator g : kGenerators) {
    for (DType d : testing::kFloatDTypes) {
      const std::string what = fmt::format("{} of {}", generator_name(g), dtype_name(d));
      INFO(what);
      // On one device every generator, normal_ included, is a function of the global index.
      const auto same = [&](const Tensor& gpu, const Tensor& cpu_of_same_layout, const Tensor& gpu_slice,
                            const std::string& part) {
        check_bitwise(gpu, gpu_slice, part + " vs the whole GPU draw");
        if (g == Generator::kNormal) {
          check_normal(gpu, cpu_of_same_layout, 0.5, part + " vs the CPU's");
        } else {
          check_bitwise(gpu, cpu_of_same_layout, part + " vs the CPU's");
        }
      };
      const Tensor whole = draw(g, {8, 6}, d, 42, kGpu);
      const ShardLayout columns{{8, 6}, {0, 2}};
      same(draw(g, {8, 3}, d, 42, kGpu, columns), draw(g, {8, 3}, d, 42, kCPU, columns), whole.slice(1, 2, 5),
           "[0:8, 2:5] block");
      const Tensor whole3 = draw(g, {7, 5, 3}, d, 7, kGpu);
      for (int64_t start : {0, 3, 6}) {
        const int64_t rows = std::min<int64_t>(3, 7 - start);
        const ShardLayout chunk{{7, 5, 3}, {start, 0, 0}};
        same(draw(g, {rows, 5, 3}, d, 7, kGpu, chunk), draw(g, {rows, 5, 3}, d, 7, kCPU, chunk),
             whole3.narrow(0, start, rows), fmt::format("chunk at row {}", start));
      }
      const ShardLayout inner{{7, 5, 3}, {4, 1, 1}};
      same(draw(g, {2, 3, 2}, d, 7, kGpu, inner), draw(g, {2, 3, 2}, d, 7, kCPU, inner),
           whole3.narrow(0, 4, 2).narrow(1, 1, 3).narrow(2, 1, 2), "inner block");
      // A large sharded draw: rows 1000..3999 of [4097, 65] (odd width: blocks straddle rows).
      const Tensor big = draw(g, {4097, 65}, d, 5, kGpu);
      const ShardLayout rows{{4097, 65}, {1000, 0}};
      same(draw(g, {3000, 65}, d, 5, kGpu, rows), draw(g, {3000, 65}, d, 5, kCPU, rows), big.narrow(0, 1000, 3000),
           "rows 1000..3999");
      CHECK(draw(g, {0, 6}, d, 42, kGpu, ShardLayout{{8, 6}, {8, 0}}).numel() == 0);
    }
  }
  // bernoulli in the integer and bool dtypes, sharded.
  for (DType d : {kInt32, kInt64, kBool}) {
    const Tensor whole = bernoulli({9, 7}, 0.4, 3, d, std::nullopt, kGpu);
    const ShardLayout block{{9, 7}, {2, 3}};
    check_bitwise(bernoulli({5, 4}, 0.4, 3, d, block, kGpu), whole.narrow(0, 2, 5).narrow(1, 3, 4),
                  fmt::format("bernoulli {} block", dtype_name(d)));
    check_bitwise(bernoulli({5, 4}, 0.4, 3, d, block, kGpu), bernoulli({5, 4}, 0.4, 3, d, block),
                  fmt::format("bernoulli {} block vs the CPU's", dtype_name(d)));
  }
}

TEST_CASE("CUDA draws are the same on every call", "[gpu]") {
  Tensor a = Tensor::empty({4097}, kFloat32, kGpu), b = Tensor::empty({4097}, kFloat32, kGpu);
  normal_(a, 0.0, 1.0, 11);
  normal_(b, 0.0, 1.0, 11);
  check_bitwise(a, b, "normal_ twice");
  normal_(b, 0.0, 1.0, 12);
  CHECK(to_f64(a) != to_f64(b));
}

}  // namespace
}  // namespace dtr
