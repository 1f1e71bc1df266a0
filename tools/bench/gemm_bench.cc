// gemm_bench: dtr's CPU GEMM (kernels/cpu/gemm.h) at the reference model's forward and
// backward products and 2048x1024x4096, float32 and bfloat16, on 1 and 2 threads, against
// Eigen's GEMM on the same buffers, PyTorch's torch.mm (optional peer,
// tools/bench/peers/gemm_peer.py) and the host's FMA peak, all measured in this run.
//   bazel run -c opt //tools/bench:gemm_bench
// Each row is checked (sampled elements against float64) before it is timed; the table ends
// with geometric means per dtype and thread count. Method and latest table: docs/cpu_gemm.md.
#include <immintrin.h>
#include <omp.h>
#include <Eigen/Core>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "core/parallel.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/peer.h"
#include "tools/command_line.h"
#include "tools/tool_main.h"

namespace dtr::bench {
namespace {

// One product: C [m, n] = A [m, k] B [k, n], each operand row-major ('n') or a transposed view ('t').
struct Shape {
  const char* name;
  int64_t m, k, n;
  char la, lb;
};

// The reference model (tokens 8 x 128 = 1024, dim 256, ffn 1024, vocab 4096): forward x W^T,
// input gradient dy W, weight gradient dy^T x; then a large layer.
constexpr Shape kShapes[] = {
    {"qkv fwd", 1024, 256, 768, 'n', 't'},       {"ffn up fwd", 1024, 256, 1024, 'n', 't'},
    {"ffn down fwd", 1024, 1024, 256, 'n', 't'}, {"lm head fwd", 1024, 256, 4096, 'n', 't'},
    {"ffn up dX", 1024, 1024, 256, 'n', 'n'},    {"ffn up dW", 1024, 1024, 256, 't', 'n'},
    {"lm head dX", 1024, 4096, 256, 'n', 'n'},   {"lm head dW", 4096, 1024, 256, 't', 'n'},
    {"layer up", 2048, 1024, 4096, 'n', 'n'},
};

// Measured FMA throughput, GFLOP/s, on `threads` threads at once: 12 independent FMA chains
// per thread (16 lanes with AVX-512, else 8), best of several runs.
double fma_peak(int threads) {
#ifdef __AVX512F__
  using Vec = __m512;
  constexpr int kLanes = 16;
  auto fma = [](Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); };
  auto splat = [](float x) { return _mm512_set1_ps(x); };
  auto lane0 = [](Vec v) { return _mm512_cvtss_f32(v); };
#else
  using Vec = __m256;
  constexpr int kLanes = 8;
  auto fma = [](Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); };
  auto splat = [](float x) { return _mm256_set1_ps(x); };
  auto lane0 = [](Vec v) { return _mm256_cvtss_f32(v); };
#endif
  constexpr int64_t kIters = 20'000'000;
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    float sink = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      Vec acc[12];
      for (int i = 0; i < 12; ++i) acc[i] = splat(static_cast<float>(i));
      const Vec x = splat(0.999999f), y = splat(1e-7f);
      for (int64_t it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; ++i) acc[i] = fma(acc[i], x, y);
      }
      for (int i = 0; i < 12; ++i) sink += lane0(acc[i]);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (sink == 12345.0f) std::cout << "";  // keeps the chains live
    best = std::max(best, 2.0 * kLanes * 12 * kIters * threads / s / 1e9);
  }
  return best;
}

// A rows x cols operand in layout l, values uniform in [-1, 1) rounded to T.
template <class T>
struct Operand {
  int64_t rows, cols;
  char layout;
  std::vector<T> data;
  Operand(int64_t r, int64_t c, char l, uint64_t seed) : rows(r), cols(c), layout(l), data(r * c) {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (T& v : data) v = T(dist(gen));
  }
  cpu::GemmMatrix<const T> matrix() const {
    return layout == 'n' ? cpu::GemmMatrix<const T>{data.data(), cols, 1, 0}
                         : cpu::GemmMatrix<const T>{data.data(), 1, rows, 0};
  }
  double at(int64_t i, int64_t j) const {
    return static_cast<float>(layout == 'n' ? data[i * cols + j] : data[j * rows + i]);
  }
};

struct Result {
  double dtr = 0, eigen = 0;
  bool ok = true;
};

template <class T>
Result run_case(const Shape& s, cpu::CpuIsa isa) {
  const Operand<T> a(s.m, s.k, s.la, 1), b(s.k, s.n, s.lb, 2);
  std::vector<float> c(s.m * s.n);
  auto run = [&] {
    cpu::gemm(1, s.m, s.n, s.k, a.matrix(), b.matrix(), cpu::GemmMatrix<float>{c.data(), s.n, 1, 0}, {.isa = isa});
  };
  run();
  Result r;
  for (int64_t t = 0; t < 64; ++t) {  // sampled elements against float64
    const int64_t i = t * 7919 % s.m, j = t * 104729 % s.n;
    double want = 0;
    for (int64_t p = 0; p < s.k; ++p) want += a.at(i, p) * b.at(p, j);
    if (std::abs(c[i * s.n + j] - want) > 1e-5 * s.k) r.ok = false;
  }
  const double flops = 2.0 * s.m * s.n * s.k;
  if constexpr (std::is_same_v<T, float>) {
    using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using ColMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
    Eigen::Map<RowMajor> ec(c.data(), s.m, s.n);
    // Eigen's product on the same buffers in the same layouts.
    auto eigen = [&] {
      Eigen::setNbThreads(num_threads());
      auto with = [](const Operand<float>& x, auto&& f) {
        if (x.layout == 'n') {
          f(Eigen::Map<const RowMajor>(x.data.data(), x.rows, x.cols));
        } else {
          f(Eigen::Map<const ColMajor>(x.data.data(), x.rows, x.cols));
        }
      };
      with(a, [&](const auto& ea) { with(b, [&](const auto& eb) { ec.noalias() = ea * eb; }); });
    };
    // Samples alternate with dtr's, so both see the host's load alike.
    const PairTiming pair = time_pair(run, eigen);
    r.dtr = flops / pair.fn.median_us / 1e3;
    r.eigen = flops / pair.ref.median_us / 1e3;
  } else {
    r.dtr = flops / time_it(run).median_us / 1e3;
  }
  return r;
}

std::string peer_case(const Shape& s, const char* dtype, int threads) {
  return fmt::format("{},{},{},{},{},{},{}", s.m, s.k, s.n, s.la, s.lb, dtype, threads);
}

std::string figure(double v) { return v > 0 ? fmt::format("{:.0f}", v) : "-"; }
std::string ratio(double a, double b) { return a > 0 && b > 0 ? fmt::format("{:.2f}", a / b) : "-"; }

int run_main(int argc, char** argv) {
  CLI::App app{"dtr's CPU GEMM against Eigen, torch.mm and the FMA peak"};
  std::vector<int> thread_counts = {1, 2};
  std::string python = default_peer_python();
  bool no_peer = false;
  std::string filter;
  app.add_option("--threads", thread_counts, "thread counts to run (default 1 2)");
  app.add_option("--python", python, "the Python that runs the PyTorch peer");
  app.add_flag("--no-peer", no_peer, "skip torch.mm");
  app.add_option("--filter", filter, "run only the products whose name contains this");
  if (const std::optional<int> exit_code = dtr::parse_command_line("gemm_bench", app, argc, argv)) return *exit_code;
  enter_workspace();
  const cpu::CpuIsa isa = cpu::cpu_isa();
  // Other work on the machine takes cores from the threads: print the load so a reader can judge.
  std::string load = "?";
  std::ifstream("/proc/loadavg") >> load;
  std::cout << fmt::format("gemm_bench: path {} (detected {}), load average {}; GFLOP/s = 2 M K N / median time\n",
                           cpu::cpu_isa_name(isa), cpu::cpu_isa_name(cpu::detected_cpu_isa()), load);
  // dtr and Eigen first, then the peer over every case in one process.
  struct Row {
    const Shape* shape;
    const char* dtype;
    int threads;
    Result result;
    double torch = 0, peak = 0;
  };
  std::vector<Row> rows;
  std::vector<std::string> peer_args;
  for (const int threads : thread_counts) {
    set_num_threads(threads);
    const double peak = fma_peak(threads);
    for (const char* dtype : {"float32", "bfloat16"}) {
      for (const Shape& s : kShapes) {
        if (std::string_view(s.name).find(filter) == std::string_view::npos) continue;
        const bool f32 = std::string_view(dtype) == "float32";
        rows.push_back({&s, dtype, threads, f32 ? run_case<float>(s, isa) : run_case<BFloat16>(s, isa), 0, peak});
        peer_args.push_back(peer_case(s, dtype, threads));
      }
    }
  }
  std::map<std::string, double> torch;
  if (!no_peer) {
    std::string args;
    for (const std::string& a : peer_args) args += " " + a;
    std::istringstream out(command_output(python + " tools/bench/peers/gemm_peer.py" + args));
    std::string word, key;
    double value = 0;
    while (out >> word) {
      if (word == "torch" && out >> key >> value) torch[key] = value;
    }
    if (torch.empty()) std::cout << "torch.mm: peer did not run (no torch at " << python << ")\n";
  }
  std::cout << fmt::format(
      "| {:<13} | {:<8} | {:>2} | {:<22} | {:>5} | {:>5} | {:>5} | {:>5} | {:>8} | {:>8} | {:>8} | {:<5} |\n",
      "product", "dtype", "th", "M x K x N (A, B)", "dtr", "Eigen", "torch", "peak", "dtr/torch", "dtr/peak",
      "dtr/Eigen", "check");
  std::cout << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::map<std::string, std::vector<double>> vs_torch, vs_peak;
  int wrong = 0;
  for (Row& r : rows) {
    const auto it = torch.find(peer_case(*r.shape, r.dtype, r.threads));
    r.torch = it != torch.end() ? it->second : 0;
    const Shape& s = *r.shape;
    std::cout << fmt::format(
        "| {:<13} | {:<8} | {:>2} | {:<22} | {:>5} | {:>5} | {:>5} | {:>5} | {:>8} | {:>8} | {:>8} | {:<5} |\n", s.name,
        r.dtype, r.threads, fmt::format("{}x{}x{} ({}, {})", s.m, s.k, s.n, s.la, s.lb), figure(r.result.dtr),
        figure(r.result.eigen), figure(r.torch), figure(r.peak), ratio(r.result.dtr, r.torch),
        ratio(r.result.dtr, r.peak), ratio(r.result.dtr, r.result.eigen), r.result.ok ? "ok" : "WRONG");
    wrong += r.result.ok ? 0 : 1;
    const std::string key = fmt::format("{} {} thread(s)", r.dtype, r.threads);
    if (r.torch > 0) vs_torch[key].push_back(r.result.dtr / r.torch);
    vs_peak[key].push_back(r.result.dtr / r.peak);
  }
  auto geomean = [](const std::vector<double>& v) {
    double log_sum = 0;
    for (const double x : v) log_sum += std::log(x);
    return std::exp(log_sum / static_cast<double>(v.size()));
  };
  for (const auto& [key, v] : vs_peak) {
    const auto t = vs_torch.find(key);
    std::cout << fmt::format("geomean {}: dtr/peak {:.2f}, dtr/torch {}\n", key, geomean(v),
                             t != vs_torch.end() ? fmt::format("{:.2f} (min {:.2f})", geomean(t->second),
                                                               *std::min_element(t->second.begin(), t->second.end()))
                                                 : "-");
  }
  return wrong > 0 ? 1 : 0;
}

}  // namespace
}  // namespace dtr::bench

int main(int argc, char** argv) {
  return dtr::tool_main("gemm_bench", [&] { return dtr::bench::run_main(argc, argv); });
}
