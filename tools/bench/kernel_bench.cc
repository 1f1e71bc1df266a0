// kernel_bench: times dtr's CPU kernels at transformer shapes against a memcpy of the same
// bytes, measured in the same run. `bazel run //tools/bench:kernel_bench -- --quick`.
//
// Shapes are the seed model's: 2048 tokens, hidden 1024, FFN 4096, vocab 50000, and a
// 64 Mi-element parameter for the optimizer steps (--quick shrinks them all). Each row
// is one add_*_rows function below: to add a kernel, write one that builds its inputs,
// its run, an independent check and its bytes (or flops) and reference, and call it
// from main. Rows are checked before they are timed; any WRONG row makes the exit code 1.
#include <omp.h>

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>

#include "kernels/fill.h"
#include "kernels/index.h"
#include "kernels/optimizer_step.h"
#include "kernels/parallel.h"
#include "kernels/shape_ops.h"
#include "tools/bench/bench_util.h"

namespace dtr::bench {
namespace {

struct Shapes {
  int64_t tokens;  // rows of activations in one batch
  int64_t hidden;
  int64_t ffn;
  int64_t vocab;
  int64_t params;  // elements of the parameter the optimizer rows update
};
constexpr Shapes kFullShapes{2048, 1024, 4096, 50000, int64_t{64} << 20};
constexpr Shapes kQuickShapes{256, 256, 1024, 5000, int64_t{1} << 20};

// Deterministic values in [-1, 1) (a multiplicative hash of the index: fast at 64 Mi elements).
Tensor pattern(Shape shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  dispatch_floating(dtype, "pattern", [&]<class T>(TypeTag<T>) {
    T* p = t.data_ptr<T>();
    const int64_t n = t.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
      p[i] = convert<T>(static_cast<double>(h >> 40) / static_cast<double>(uint64_t{1} << 23) - 1.0);
    }
  });
  return t;
}

Tensor random_indices(int64_t count, int64_t hi, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, hi - 1);
  Tensor t = Tensor::empty({count}, kInt64);
  for (int64_t i = 0; i < count; ++i) t.data_ptr<int64_t>()[i] = dist(gen);
  return t;
}

std::string shape_str(const Shape& s) { return fmt::format("{}", s); }

// A case whose reference is a memcpy moving the same bytes.
Case memcpy_case(double bytes, std::function<void()> run, std::function<std::string()> check) {
  return Case{.bytes = bytes, .run = std::move(run), .check = std::move(check), .reference = memcpy_reference(bytes)};
}

void add_memcpy_rows(Suite& suite, const Shapes& s) {
  const int64_t n = s.tokens * s.ffn * 4;
  suite.add({"memcpy", "bytes", fmt::format("{} MiB", n >> 20), [n] {
               auto src = std::make_shared<std::vector<char>>(n, 1), dst = std::make_shared<std::vector<char>>(n);
               for (int64_t i = 0; i < n; ++i) (*src)[i] = static_cast<char>(i * 7);
               return memcpy_case(
                   2.0 * n, [src, dst] { std::memcpy(dst->data(), src->data(), src->size()); },
                   [src, dst] { return *src == *dst ? std::string() : std::string("dst differs from src"); });
             }});
}

void add_copy_rows(Suite& suite, const Shapes& s) {
  const Shape shape{s.tokens, s.ffn};
  struct Variant {
    DType from, to;
    bool transpose;
  };
  for (Variant v : {Variant{kFloat32, kFloat32, false}, Variant{kFloat32, kFloat32, true},
                    Variant{kFloat32, kBFloat16, false}, Variant{kBFloat16, kFloat32, false}}) {
    const std::string op = v.transpose ? "copy (.t())" : v.from == v.to ? "copy" : "cast";
    const std::string dtype = v.from == v.to ? std::string(dtype_name(v.from))
                                             : fmt::format("{}->{}", v.from, v.to);
    suite.add({op, dtype, shape_str(shape), [shape, v] {
                 Tensor src = pattern(shape, v.from, 1);
                 Tensor view = v.transpose ? src.t() : src;
                 Tensor dst = Tensor::empty(view.shape(), v.to);
                 const double bytes = static_cast<double>(src.nbytes() + dst.nbytes());
                 return memcpy_case(
                     bytes, [dst, view]() mutable { dst.copy_(view); },
                     [dst, view, to = v.to] {
                       return check_sampled(dst, [&](std::span<const int64_t> c) {
                         const double x = element_at(view, c);
                         if (to == kFloat32) return x;
                         return static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(x))));
                       }, 0.0, 0.0);
                     });
               }});
  }
}

void add_fill_rows(Suite& suite, const Shapes& s) {
  const Shape shape{s.tokens, s.ffn};
  suite.add({"fill_", "float32", shape_str(shape), [shape] {
               Tensor t = Tensor::empty(shape);
               return memcpy_case(
                   static_cast<double>(t.nbytes()), [t]() mutable { fill_(t, 0.5); },
                   [t] { return check_sampled(t, [](std::span<const int64_t>) { return 0.5; }, 0.0, 0.0); });
             }});
}

void add_cat_rows(Suite& suite, const Shapes& s) {
  // dim 0: packing 8 square weights into one flat buffer (FSDP's all-gather input).
  // dim 1: q, k and v activations side by side.
  struct Variant {
    int64_t pieces, dim;
    Shape piece;
  };
  for (const Variant& v : {Variant{8, 0, {s.hidden, s.hidden}}, Variant{3, 1, {s.tokens, s.hidden}}}) {
    for (DType dtype : {kFloat32, kBFloat16}) {
      suite.add({fmt::format("cat dim {}", v.dim), std::string(dtype_name(dtype)),
                 fmt::format("{} x {}", v.pieces, v.piece), [v, dtype] {
                   std::vector<Tensor> parts;
                   for (int64_t i = 0; i < v.pieces; ++i) parts.push_back(pattern(v.piece, dtype, i));
                   Tensor out = cat(parts, v.dim);
                   return memcpy_case(
                       2.0 * static_cast<double>(out.nbytes()),
                       [out, parts, v]() mutable { cat_out(out, parts, v.dim); },
                       [out, parts, v] {
                         return check_sampled(out, [&](std::span<const int64_t> c) {
                           Shape at(c.begin(), c.end());
                           const int64_t piece = at[v.dim] / v.piece[v.dim];
                           at[v.dim] %= v.piece[v.dim];
                           return element_at(parts[piece], at);
                         }, 0.0, 0.0);
                       });
                 }});
    }
  }
}

void add_index_rows(Suite& suite, const Shapes& s) {
  const Shape table_shape{s.vocab, s.hidden};
  for (DType dtype : {kFloat32, kBFloat16}) {
    suite.add({"index_select", std::string(dtype_name(dtype)),
               fmt::format("{} rows of {}", s.tokens, table_shape), [table_shape, dtype, tokens = s.tokens] {
                 Tensor table = pattern(table_shape, dtype, 3), index = random_indices(tokens, table_shape[0], 4);
                 Tensor out = index_select(table, 0, index);
                 return memcpy_case(
                     2.0 * static_cast<double>(out.nbytes()) + static_cast<double>(index.nbytes()),
                     [table, index, out]() mutable { out = index_select(table, 0, index); },
                     [table, index, out] {
                       return check_sampled(out, [&](std::span<const int64_t> c) {
                         const int64_t row = index.data_ptr<int64_t>()[c[0]];
                         return element_at(table, std::vector<int64_t>{row, c[1]});
                       }, 0.0, 0.0);
                     });
               }});
  }
  // The embedding's backward: token gradients added into their rows.
  suite.add({"index_add_", "float32", fmt::format("{} rows into {}", s.tokens, table_shape),
             [table_shape, tokens = s.tokens] {
               Tensor grad_table = zeros(table_shape), index = random_indices(tokens, table_shape[0], 5);
               Tensor grad_rows = pattern({tokens, table_shape[1]}, kFloat32, 6);
               // Which tokens land in each row, for the check after one run from zeros.
               auto tokens_of = std::make_shared<std::vector<std::vector<int64_t>>>(table_shape[0]);
               for (int64_t k = 0; k < tokens; ++k) (*tokens_of)[index.data_ptr<int64_t>()[k]].push_back(k);
               return memcpy_case(
                   3.0 * static_cast<double>(grad_rows.nbytes()) + static_cast<double>(index.nbytes()),
                   [grad_table, index, grad_rows]() mutable { index_add_(grad_table, 0, index, grad_rows); },
                   [grad_table, grad_rows, tokens_of] {
                     return check_sampled(grad_table, [&](std::span<const int64_t> c) {
                       double sum = 0;
                       for (int64_t k : (*tokens_of)[c[0]]) sum += element_at(grad_rows, std::vector<int64_t>{k, c[1]});
                       return sum;
                     }, 1e-6, 1e-5);
                   });
             }});
}

enum class Optimizer { kSgd, kAdam, kAdamW };

// One row per optimizer: param, grad and state of s.params elements, checked after step 1.
void add_optimizer_rows(Suite& suite, const Shapes& s) {
  struct Variant {
    Optimizer opt;
    DType dtype;
  };
  for (Variant v : {Variant{Optimizer::kSgd, kFloat32}, Variant{Optimizer::kAdam, kFloat32},
                    Variant{Optimizer::kAdamW, kFloat32}, Variant{Optimizer::kAdamW, kBFloat16}}) {
    const char* op = v.opt == Optimizer::kSgd ? "sgd_step_" : v.opt == Optimizer::kAdam ? "adam_step_" : "adamw_step_";
    suite.add({op, std::string(dtype_name(v.dtype)), fmt::format("{} Mi", s.params >> 20), [v, n = s.params] {
                 const DType state_dtype = optimizer_state_dtype(v.dtype);
                 Tensor param = pattern({n}, v.dtype, 7), grad = pattern({n}, v.dtype, 8);
                 Tensor initial = param.clone();
                 Tensor m = zeros({n}, state_dtype), sq = v.opt == Optimizer::kSgd ? Tensor() : zeros({n}, state_dtype);
                 const SgdOptions sgd{.lr = 1e-3, .momentum = 0.9};
                 const AdamOptions adam{.lr = 1e-3, .weight_decay = 1e-2};
                 const AdamWOptions adamw{.lr = 1e-3, .weight_decay = 1e-2};
                 // param and grad are read, param and every state tensor read and written.
                 const double bytes = static_cast<double>(2 * param.nbytes() + grad.nbytes()) +
                                      2.0 * static_cast<double>(m.nbytes() + (sq.defined() ? sq.nbytes() : 0));
                 auto run = [=, step = int64_t{0}]() mutable {
                   ++step;
                   if (v.opt == Optimizer::kSgd) {
                     sgd_step_(param, grad, m, step, sgd);
                   } else if (v.opt == Optimizer::kAdam) {
                     adam_step_(param, grad, m, sq, step, adam);
                   } else {
                     adamw_step_(param, grad, m, sq, step, adamw);
                   }
                 };
                 // Step 1 from zero state, from the textbook formulas: SGD's buffer is the gradient;
                 // Adam's bias-corrected moments are g and g^2, so the update is lr * g / (|g| + eps).
                 auto expected = [=](std::span<const int64_t> c) {
                   const double p = element_at(initial, c), g = element_at(grad, c);
                   if (v.opt == Optimizer::kSgd) return p - sgd.lr * g;
                   if (v.opt == Optimizer::kAdam) {
                     const double g_l2 = g + adam.weight_decay * p;
                     return p - adam.lr * g_l2 / (std::abs(g_l2) + adam.eps);
                   }
                   return p * (1 - adamw.lr * adamw.weight_decay) - adamw.lr * g / (std::abs(g) + adamw.eps);
                 };
                 const double tolerance = v.dtype == kBFloat16 ? 1e-2 : 1e-6;
                 return memcpy_case(bytes, run, [param, expected, tolerance] {
                   return check_sampled(param, expected, tolerance, 1e-5);
                 });
               }});
  }
}

int run_main(int argc, char** argv) {
  CLI::App app{"dtr kernel benchmarks: each row checked, then timed against a memcpy of the same bytes"};
  int threads = 0;
  std::string filter;
  bool quick = false;
  app.add_option("--threads", threads, "OpenMP threads for the kernels and the reference (default: every core)")
      ->check(CLI::PositiveNumber);
  app.add_option("--filter", filter, "run only the rows whose 'op dtype shape' contains this");
  app.add_flag("--quick", quick, "small shapes: a smoke test that takes seconds");
  CLI11_PARSE(app, argc, argv);
  set_num_threads(threads > 0 ? threads : omp_get_num_procs());
  const Shapes& s = quick ? kQuickShapes : kFullShapes;
  // Other work on the machine steals cores from OpenMP's threads: print the load so a reader can judge.
  std::string load = "?";
  std::ifstream("/proc/loadavg") >> load;
  std::cout << fmt::format(
      "kernel_bench: {} threads, load average {}; tokens {}, hidden {}, ffn {}, vocab {}, optimizer params {} Mi{}\n",
      num_threads(), load, s.tokens, s.hidden, s.ffn, s.vocab, s.params >> 20, quick ? " (--quick)" : "");
  Suite suite;
  add_memcpy_rows(suite, s);
  add_copy_rows(suite, s);
  add_fill_rows(suite, s);
  add_cat_rows(suite, s);
  add_index_rows(suite, s);
  add_optimizer_rows(suite, s);
  const int wrong = suite.run(filter, TimingOptions{}, std::cout);
  if (wrong > 0) std::cout << wrong << " rows WRONG\n";
  return wrong > 0 ? 1 : 0;
}

}  // namespace
}  // namespace dtr::bench

int main(int argc, char** argv) {
  try {
    return dtr::bench::run_main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kernel_bench: " << e.what() << "\n";
    return 1;
  }
}
