// kernel_bench: times dtr's CPU kernels at transformer shapes against a memcpy of the same
// bytes (matmul: Eigen's GEMM), measured in the same run.
//   bazel run //tools/bench:kernel_bench -- --threads 1
//
// Each row is one add_*_rows function below: to add a kernel, write one that builds its
// inputs, its run, an independent check and its bytes (or flops) and reference, and call it
// from main. Rows are checked before they are timed; any WRONG row makes the exit code 1.
// A row and its reference are timed in alternating samples; each row also runs as an
// in-cache twin, which says whether memory or arithmetic bounds it. Shapes (--quick shrinks
// them), method, machine and the latest table: docs/kernel_bench.md.
#include <omp.h>

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>

#include <Eigen/Core>

#include "core/parallel.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fill.h"
#include "kernels/index.h"
#include "kernels/layer_norm.h"
#include "kernels/matmul.h"
#include "kernels/optimizer_step.h"
#include "kernels/random.h"
#include "kernels/reduce.h"
#include "kernels/relu_mask.h"
#include "kernels/shape_ops.h"
#include "kernels/softmax.h"
#include "tools/bench/bench_util.h"
#include "tools/command_line.h"
#include "tools/tool_main.h"

namespace dtr::bench {
namespace {

struct Shapes {
  int64_t tokens;  // rows of activations in one batch
  int64_t hidden;
  int64_t ffn;
  int64_t vocab;   // the width of the logits
  int64_t table;   // rows of the tables that embedding and index_select gather from
  int64_t params;  // elements of the parameter the optimizer rows update
};
constexpr Shapes kFullShapes{2048, 1024, 4096, 50000, 50000, int64_t{64} << 20};
constexpr Shapes kQuickShapes{256, 256, 1024, 5000, 5000, int64_t{1} << 20};
// The in-cache twins of the full rows: the same widths at 64 tokens, or 4 where 64 tokens
// do not fit in the caches (the vocabulary rows), with tables that fit too.
constexpr Shapes kInCacheShapes[] = {{64, 1024, 4096, 50000, 256, int64_t{128} << 10},
                                     {4, 1024, 4096, 50000, 256, int64_t{32} << 10}};

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

// out = make(), the previous result released first: the allocator hands its block back,
// so each call of a row writes the same memory, as its memcpy reference writes the same
// destination. (Holding the previous result while making the next doubles the memory a
// row writes to, and with it the row's footprint in the caches.)
template <class T, class Make>
void remake(T& out, Make&& make) {
  out = T{};
  out = make();
}

// A case whose reference is a memcpy moving the same bytes.
Case memcpy_case(double bytes, std::function<void()> run, std::function<std::string()> check) {
  return Case{.bytes = bytes, .run = std::move(run), .check = std::move(check), .reference = memcpy_reference(bytes)};
}

// Relative tolerance of a result stored in dtype against a float64 reference.
double rtol_for(DType dtype) {
  switch (dtype) {
    case kBFloat16: return 1e-2;
    case kFloat16: return 2e-3;
    default: return 1e-5;
  }
}

// The coordinates of a 2-D element, for element_at.
std::vector<int64_t> at2(int64_t i, int64_t j) { return {i, j}; }

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
    const std::string dtype = v.from == v.to ? std::string(dtype_name(v.from)) : fmt::format("{}->{}", v.from, v.to);
    suite.add({op, dtype, shape_str(shape), [shape, v] {
                 Tensor src = pattern(shape, v.from, 1);
                 Tensor view = v.transpose ? src.t() : src;
                 Tensor dst = Tensor::empty(view.shape(), v.to);
                 const double bytes = static_cast<double>(src.nbytes() + dst.nbytes());
                 return memcpy_case(
                     bytes, [dst, view]() mutable { dst.copy_(view); },
                     [dst, view, to = v.to] {
                       return check_sampled(
                           dst,
                           [&](std::span<const int64_t> c) {
                             const double x = element_at(view, c);
                             if (to == kFloat32) return x;
                             return static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(x))));
                           },
                           0.0, 0.0);
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
                   [t] {
                     return check_sampled(
                         t, [](std::span<const int64_t>) { return 0.5; }, 0.0, 0.0);
                   });
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
                         return check_sampled(
                             out,
                             [&](std::span<const int64_t> c) {
                               Shape at(c.begin(), c.end());
                               const int64_t piece = at[v.dim] / v.piece[v.dim];
                               at[v.dim] %= v.piece[v.dim];
                               return element_at(parts[piece], at);
                             },
                             0.0, 0.0);
                       });
                 }});
    }
  }
}

void add_index_rows(Suite& suite, const Shapes& s) {
  const Shape table_shape{s.table, s.hidden};
  for (DType dtype : {kFloat32, kBFloat16}) {
    suite.add({"index_select", std::string(dtype_name(dtype)), fmt::format("{} rows of {}", s.tokens, table_shape),
               [table_shape, dtype, tokens = s.tokens] {
                 Tensor table = pattern(table_shape, dtype, 3), index = random_indices(tokens, table_shape[0], 4);
                 Tensor out = index_select(table, 0, index);
                 return memcpy_case(
                     2.0 * static_cast<double>(out.nbytes()) + static_cast<double>(index.nbytes()),
                     [table, index, out]() mutable { remake(out, [&] { return index_select(table, 0, index); }); },
                     [table, index, out] {
                       return check_sampled(
                           out,
                           [&](std::span<const int64_t> c) {
                             const int64_t row = index.data_ptr<int64_t>()[c[0]];
                             return element_at(table, std::vector<int64_t>{row, c[1]});
                           },
                           0.0, 0.0);
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
                     return check_sampled(
                         grad_table,
                         [&](std::span<const int64_t> c) {
                           double sum = 0;
                           for (int64_t k : (*tokens_of)[c[0]])
                             sum += element_at(grad_rows, std::vector<int64_t>{k, c[1]});
                           return sum;
                         },
                         1e-6, 1e-5);
                   });
             }});
}

// Elementwise ops on the FFN activation [tokens, ffn]: binary (add, mul, and add of a
// bias row broadcast over the tokens), unary (exp, tanh-gelu, relu) and gelu's backward,
// in each floating dtype a transformer stores activations in. Each reads its operands and
// writes its result once, so a memcpy of those bytes is the bound.
void add_elementwise_rows(Suite& suite, const Shapes& s) {
  const Shape shape{s.tokens, s.ffn};
  constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)
  constexpr double kGeluCubic = 0.044715;
  auto gelu_tanh = [=](double x) { return 0.5 * x * (1 + std::tanh(kGeluK * (x + kGeluCubic * x * x * x))); };
  auto gelu_tanh_grad = [=](double x) {
    const double t = std::tanh(kGeluK * (x + kGeluCubic * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kGeluK * (1 + 3 * kGeluCubic * x * x);
  };
  struct Variant {
    std::string op;
    int operands;  // 1: f(a); 2: f(a, b)
    bool bias;     // b is a [ffn] row broadcast over the tokens
    std::function<Tensor(const Tensor&, const Tensor&)> run;
    std::function<double(double, double)> expected;
  };
  const std::vector<Variant> variants{
      {"add", 2, false, [](const Tensor& a, const Tensor& b) { return add(a, b); },
       [](double a, double b) { return a + b; }},
      {"add (bias row)", 2, true, [](const Tensor& a, const Tensor& b) { return add(a, b); },
       [](double a, double b) { return a + b; }},
      {"mul", 2, false, [](const Tensor& a, const Tensor& b) { return mul(a, b); },
       [](double a, double b) { return a * b; }},
      {"exp", 1, false, [](const Tensor& a, const Tensor&) { return exp(a); },
       [](double a, double) { return std::exp(a); }},
      {"gelu (tanh)", 1, false, [](const Tensor& a, const Tensor&) { return gelu(a, GeluApproximation::kTanh); },
       [=](double a, double) { return gelu_tanh(a); }},
      {"relu", 1, false, [](const Tensor& a, const Tensor&) { return relu(a); },
       [](double a, double) { return std::max(a, 0.0); }},
      {"gelu_backward (tanh)", 2, false,
       [](const Tensor& g, const Tensor& x) { return gelu_backward(g, x, GeluApproximation::kTanh); },
       [=](double g, double x) { return g * gelu_tanh_grad(x); }},
  };
  for (const Variant& v : variants) {
    for (DType dtype : {kFloat32, kBFloat16, kFloat16}) {
      const std::string shape_label = v.bias ? fmt::format("{} + [{}]", shape, shape[1]) : shape_str(shape);
      suite.add({v.op, std::string(dtype_name(dtype)), shape_label, [v, shape, dtype] {
                   const Tensor a = pattern(shape, dtype, 21);
                   const Tensor b = v.operands == 1 ? Tensor() : pattern(v.bias ? Shape{shape[1]} : shape, dtype, 22);
                   auto out = std::make_shared<Tensor>(v.run(a, b));
                   const size_t b_bytes = b.defined() ? b.nbytes() : 0;
                   const double bytes = static_cast<double>(a.nbytes() + b_bytes + out->nbytes());
                   auto run = [v, a, b, out] { remake(*out, [&] { return v.run(a, b); }); };
                   return memcpy_case(bytes, run, [v, a, b, out, dtype] {
                     return check_sampled(
                         *out,
                         [&](std::span<const int64_t> c) {
                           const double y = !b.defined() ? 0.0
                                            : v.bias     ? element_at(b, std::vector<int64_t>{c[1]})
                                                         : element_at(b, c);
                           return v.expected(element_at(a, c), y);
                         },
                         1e-6, rtol_for(dtype));
                   });
                 }});
    }
  }
}

// ReLU's bit mask of the FFN activation (kernels/relu_mask.h): relu_mask reads y and writes
// a bit per element; apply_relu_mask_ (the backward) reads the bits and rewrites the gradient
// in place, so applying it again is the same result, which the check reads after the timing.
void add_relu_mask_rows(Suite& suite, const Shapes& s) {
  const Shape shape{s.tokens, s.ffn};
  for (DType dtype : {kFloat32, kBFloat16}) {
    suite.add({"relu_mask", std::string(dtype_name(dtype)), shape_str(shape), [shape, dtype] {
                 const Tensor y = pattern(shape, dtype, 24);
                 auto words = std::make_shared<Tensor>(relu_mask(y));
                 auto run = [y, words] { remake(*words, [&] { return relu_mask(y); }); };
                 return memcpy_case(static_cast<double>(y.nbytes() + words->nbytes()), run, [y, words] {
                   const Tensor y64 = y.to(kFloat64);
                   const auto* bits = reinterpret_cast<const uint32_t*>(words->data_ptr<int32_t>());
                   int64_t wrong = 0;
                   for (int64_t i = 0; i < y.numel(); ++i) {
                     wrong += ((bits[i / 32] >> (i % 32)) & 1U) != static_cast<uint32_t>(y64.data_ptr<double>()[i] > 0);
                   }
                   return wrong == 0 ? std::string() : fmt::format("{} bits differ from y > 0", wrong);
                 });
               }});
    suite.add({"apply_relu_mask_", std::string(dtype_name(dtype)), shape_str(shape), [shape, dtype] {
                 const Tensor y = pattern(shape, dtype, 25), g = pattern(shape, dtype, 26);
                 const Tensor words = relu_mask(y);
                 auto grad = std::make_shared<Tensor>(g.clone());
                 auto run = [grad, words] { apply_relu_mask_(*grad, words); };
                 const double bytes = 2.0 * static_cast<double>(g.nbytes()) + static_cast<double>(words.nbytes());
                 return memcpy_case(bytes, run, [y, g, grad] {
                   return check_sampled(
                       *grad, [&](std::span<const int64_t> c) { return element_at(y, c) > 0 ? element_at(g, c) : 0.0; },
                       0, 0);
                 });
               }});
  }
}

// Reductions of [tokens, ffn]: a row sum (over the last, contiguous dim), a column sum
// (over dim 0: the bias gradient of a Linear layer), and the sum of squares of all
// elements (what clip_grad_norm_ reduces). Each reads its input once.
void add_reduce_rows(Suite& suite, const Shapes& s) {
  const Shape shape{s.tokens, s.ffn};
  struct Variant {
    std::string op;
    std::vector<int64_t> dims;
    bool squares;
  };
  for (const Variant& v : {Variant{"sum (last dim)", {1}, false}, Variant{"sum (dim 0)", {0}, false},
                           Variant{"sum_of_squares", {}, true}}) {
    for (DType dtype : {kFloat32, kBFloat16}) {
      suite.add({v.op, std::string(dtype_name(dtype)), shape_str(shape), [v, shape, dtype] {
                   const Tensor x = pattern(shape, dtype, 23);
                   auto reduce = [v](const Tensor& t) {
                     return v.squares ? sum_of_squares(t, v.dims) : sum(t, v.dims);
                   };
                   auto out = std::make_shared<Tensor>(reduce(x));
                   const double bytes = static_cast<double>(x.nbytes() + out->nbytes());
                   auto run = [reduce, x, out] { remake(*out, [&] { return reduce(x); }); };
                   return memcpy_case(bytes, run, [v, x, out, dtype] {
                     // Every output's float64 sum, from one pass over x.
                     const Tensor x64 = x.to(kFloat64);
                     const double* p = x64.data_ptr<double>();
                     const int64_t rows = x.size(0), cols = x.size(1);
                     std::vector<double> expected(v.dims.empty() ? 1 : v.dims[0] == 1 ? rows : cols, 0.0);
                     for (int64_t i = 0; i < rows; ++i) {
                       for (int64_t j = 0; j < cols; ++j) {
                         const double e = p[i * cols + j];
                         expected[v.dims.empty() ? 0 : v.dims[0] == 1 ? i : j] += v.squares ? e * e : e;
                       }
                     }
                     return check_sampled(
                         *out, [&](std::span<const int64_t> c) { return expected[c.empty() ? 0 : c[0]]; }, 1e-3,
                         dtype == kBFloat16 ? 1e-2 : 1e-4);
                   });
                 }});
    }
  }
}

// matmul against Eigen's GEMM called directly on the same buffers and thread count: the
// ratio shows what dtr adds (checks, dispatch, mapping views) to the library it calls.
void add_matmul_rows(Suite& suite, const Shapes& s) {
  struct Variant {
    const char* name;
    Shape a, b;
    bool transpose_b;  // b given as a .t() view of a [n, k] weight (a Linear layer's forward)
  };
  for (const Variant& v : {Variant{"matmul_out (up)", {s.tokens, s.hidden}, {s.hidden, s.ffn}, false},
                           Variant{"matmul_out (down, x W^T)", {s.tokens, s.ffn}, {s.hidden, s.ffn}, true}}) {
    for (DType dtype : {kFloat32, kBFloat16}) {
      suite.add({v.name, std::string(dtype_name(dtype)), fmt::format("{} x {}{}", v.a, v.b, v.transpose_b ? "^T" : ""),
                 [v, dtype] {
                   Tensor a = pattern(v.a, dtype, 1), w = pattern(v.b, dtype, 2);
                   Tensor b = v.transpose_b ? w.t() : w;
                   const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
                   Tensor out = Tensor::empty({m, n}, dtype);
                   // Eigen on float32 copies of the operands (for bf16 rows: what dtr's bf16 path costs
                   // beyond a float32 GEMM).
                   using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
                   auto ea =
                       std::make_shared<RowMajor>(Eigen::Map<const RowMajor>(a.to(kFloat32).data_ptr<float>(), m, k));
                   auto ew = std::make_shared<RowMajor>(
                       Eigen::Map<const RowMajor>(w.to(kFloat32).data_ptr<float>(), w.size(0), w.size(1)));
                   auto ec = std::make_shared<RowMajor>(m, n);
                   Reference eigen{"Eigen GEMM", [ea, ew, ec, t = v.transpose_b] {
                                     Eigen::setNbThreads(num_threads());
                                     if (t) {
                                       ec->noalias() = *ea * ew->transpose();
                                     } else {
                                       ec->noalias() = *ea * *ew;
                                     }
                                   }};
                   return Case{.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k),
                               .run = [out, a, b] { matmul_out(out, a, b); },
                               .check =
                                   [out, a, b, k, dtype] {
                                     return check_sampled(
                                         out,
                                         [&](std::span<const int64_t> c) {
                                           double acc = 0;
                                           for (int64_t i = 0; i < k; ++i) {
                                             acc += element_at(a, std::vector<int64_t>{c[0], i}) *
                                                    element_at(b, std::vector<int64_t>{i, c[1]});
                                           }
                                           return acc;
                                         },
                                         1e-3, dtype == kBFloat16 ? 1e-2 : 1e-4);
                                   },
                               .reference = std::move(eigen)};
                 }});
    }
  }
  // The allocating form, against Eigen allocating its result too (the up projection).
  const Shape up_a{s.tokens, s.hidden}, up_b{s.hidden, s.ffn};
  suite.add({"matmul (up)", "float32", fmt::format("{} x {}", up_a, up_b), [up_a, up_b] {
               Tensor a = pattern(up_a, kFloat32, 1), b = pattern(up_b, kFloat32, 2);
               auto out = std::make_shared<Tensor>(matmul(a, b));
               const int64_t m = up_a[0], k = up_a[1], n = up_b[1];
               using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
               auto ea = std::make_shared<RowMajor>(Eigen::Map<const RowMajor>(a.data_ptr<float>(), m, k));
               auto eb = std::make_shared<RowMajor>(Eigen::Map<const RowMajor>(b.data_ptr<float>(), k, n));
               Reference eigen{"Eigen GEMM, new result", [ea, eb] {
                                 Eigen::setNbThreads(num_threads());
                                 const RowMajor c = *ea * *eb;  // constructed from the product: no temporary
                               }};
               return Case{.flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k),
                           .run = [out, a, b] { remake(*out, [&] { return matmul(a, b); }); },
                           .check =
                               [out, a, b, k] {
                                 return check_sampled(
                                     *out,
                                     [&](std::span<const int64_t> c) {
                                       double acc = 0;
                                       for (int64_t i = 0; i < k; ++i) {
                                         acc += element_at(a, at2(c[0], i)) * element_at(b, at2(i, c[1]));
                                       }
                                       return acc;
                                     },
                                     1e-3, 1e-4);
                               },
                           .reference = std::move(eigen)};
             }});
  // Attention scores: q [heads, tokens, head_dim] x k^T [heads, head_dim, tokens], against
  // one Eigen GEMM per head into a result allocated once.
  const int64_t heads = 16, head_dim = s.hidden / heads;
  const Shape q_shape{heads, s.tokens, head_dim}, kt_shape{heads, head_dim, s.tokens};
  suite.add({"bmm (scores)", "float32", fmt::format("{} x {}", q_shape, kt_shape), [q_shape, kt_shape] {
               Tensor q = pattern(q_shape, kFloat32, 3), kt = pattern(kt_shape, kFloat32, 4);
               auto out = std::make_shared<Tensor>(bmm(q, kt));
               const int64_t batch = q_shape[0], m = q_shape[1], k = q_shape[2], n = kt_shape[2];
               using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
               auto result = std::make_shared<std::vector<float>>(static_cast<size_t>(batch * m * n));
               Reference eigen{"Eigen GEMM per head", [q, kt, result, batch, m, k, n] {
                                 Eigen::setNbThreads(num_threads());
                                 for (int64_t h = 0; h < batch; ++h) {
                                   Eigen::Map<RowMajor>(result->data() + h * m * n, m, n).noalias() =
                                       Eigen::Map<const RowMajor>(q.data_ptr<float>() + h * m * k, m, k) *
                                       Eigen::Map<const RowMajor>(kt.data_ptr<float>() + h * k * n, k, n);
                                 }
                               }};
               const double flops = 2.0 * static_cast<double>(batch * m * n) * static_cast<double>(k);
               return Case{.flops = flops,
                           .run = [out, q, kt] { remake(*out, [&] { return bmm(q, kt); }); },
                           .check =
                               [out, q, kt, k] {
                                 return check_sampled(
                                     *out,
                                     [&](std::span<const int64_t> c) {
                                       double acc = 0;
                                       for (int64_t i = 0; i < k; ++i) {
                                         acc += element_at(q, std::vector<int64_t>{c[0], c[1], i}) *
                                                element_at(kt, std::vector<int64_t>{c[0], i, c[2]});
                                       }
                                       return acc;
                                     },
                                     1e-3, 1e-4);
                               },
                           .reference = std::move(eigen)};
             }});
}

// Row-wise kernels of a transformer step; each compared with a memcpy of the bytes it must move.
void add_row_kernel_rows(Suite& suite, const Shapes& s) {
  for (DType dtype : {kFloat32, kBFloat16}) {
    const Shape scores{s.tokens, s.ffn};
    suite.add({"softmax", std::string(dtype_name(dtype)), shape_str(scores), [scores, dtype] {
                 Tensor x = pattern(scores, dtype, 11);
                 Tensor y = softmax(x, -1);
                 auto run = [x, y]() mutable { remake(y, [&] { return softmax(x, -1); }); };
                 return memcpy_case(2.0 * static_cast<double>(x.nbytes()), run, [x, y, dtype] {
                   return check_sampled(
                       y,
                       [&](std::span<const int64_t> c) {
                         double sum = 0;
                         for (int64_t j = 0; j < x.size(1); ++j) {
                           sum += std::exp(element_at(x, std::vector<int64_t>{c[0], j}));
                         }
                         return std::exp(element_at(x, c)) / sum;
                       },
                       1e-6, dtype == kBFloat16 ? 1e-2 : 1e-5);
                 });
               }});
    const Shape act{s.tokens, s.hidden};
    suite.add({"layer_norm", std::string(dtype_name(dtype)), shape_str(act), [act, dtype] {
                 Tensor x = pattern(act, dtype, 12), w = pattern({act[1]}, dtype, 13), b = pattern({act[1]}, dtype, 14);
                 Tensor y = layer_norm(x, {act[1]}, w, b).y;
                 return memcpy_case(
                     2.0 * static_cast<double>(x.nbytes()),
                     [x, w, b, y, n = act[1]]() mutable { remake(y, [&] { return layer_norm(x, {n}, w, b).y; }); },
                     [x, w, b, y, dtype] {
                       return check_sampled(
                           y,
                           [&](std::span<const int64_t> c) {
                             const int64_t n = x.size(1);
                             double mean = 0, var = 0;
                             for (int64_t j = 0; j < n; ++j) mean += element_at(x, std::vector<int64_t>{c[0], j});
                             mean /= static_cast<double>(n);
                             for (int64_t j = 0; j < n; ++j) {
                               const double d = element_at(x, std::vector<int64_t>{c[0], j}) - mean;
                               var += d * d;
                             }
                             var /= static_cast<double>(n);
                             const std::vector<int64_t> col{c[1]};
                             return (element_at(x, c) - mean) / std::sqrt(var + 1e-5) * element_at(w, col) +
                                    element_at(b, col);
                           },
                           1e-4, dtype == kBFloat16 ? 2e-2 : 1e-4);
                     });
               }});
    const Shape logits_shape{s.tokens, s.vocab};
    suite.add({"cross_entropy fwd+bwd", std::string(dtype_name(dtype)), shape_str(logits_shape), [logits_shape, dtype] {
                 Tensor logits = pattern(logits_shape, dtype, 15),
                        target = random_indices(logits_shape[0], logits_shape[1], 16);
                 auto loss = std::make_shared<double>(0);
                 auto run = [logits, target, loss] {
                   CrossEntropyOutput out = cross_entropy(logits, target);
                   Tensor grad = cross_entropy_backward(ones({}, kFloat32), logits, target, out.logsumexp);
                   *loss = out.loss.item();
                 };
                 // Reads the logits twice (forward, backward) and writes their gradient.
                 return memcpy_case(3.0 * static_cast<double>(logits.nbytes()), run, [logits, target, loss, dtype] {
                   Tensor l = logits.to(kFloat64);
                   const double* p = l.data_ptr<double>();
                   const int64_t rows = l.size(0), classes = l.size(1);
                   double total = 0;
                   for (int64_t r = 0; r < rows; ++r) {
                     double mx = -INFINITY, sum = 0;
                     for (int64_t j = 0; j < classes; ++j) mx = std::max(mx, p[r * classes + j]);
                     for (int64_t j = 0; j < classes; ++j) sum += std::exp(p[r * classes + j] - mx);
                     total += mx + std::log(sum) - p[r * classes + target.data_ptr<int64_t>()[r]];
                   }
                   const double expected = total / static_cast<double>(rows);
                   // The loss comes back in the logits' dtype: bf16 holds 3 significant digits.
                   return std::abs(*loss - expected) <= (dtype == kBFloat16 ? 1e-2 : 1e-4) * std::abs(expected)
                              ? std::string()
                              : fmt::format("loss {} vs reference {}", *loss, expected);
                 });
               }});
  }
}

// The backward of the row-wise kernels: layer_norm over [tokens, hidden] (reads grad_y
// and x, writes grad_x; grad_weight and grad_bias are small) and softmax over
// [tokens, ffn] (reads grad_y and y, writes grad_x).
void add_row_kernel_backward_rows(Suite& suite, const Shapes& s) {
  for (DType dtype : {kFloat32, kBFloat16}) {
    const Shape act{s.tokens, s.hidden};
    suite.add({"layer_norm_backward", std::string(dtype_name(dtype)), shape_str(act), [act, dtype] {
                 const int64_t n = act[1];
                 Tensor x = pattern(act, dtype, 31), w = pattern({n}, dtype, 32), gy = pattern(act, dtype, 33);
                 LayerNormOutput fwd = layer_norm(x, {n}, w, std::nullopt);
                 auto grads = std::make_shared<LayerNormGrads>(layer_norm_backward(gy, x, fwd.mean, fwd.rstd, w));
                 const double bytes = 3.0 * static_cast<double>(x.nbytes());
                 return memcpy_case(
                     bytes,
                     [gy, x, fwd, w, grads] {
                       remake(*grads, [&] { return layer_norm_backward(gy, x, fwd.mean, fwd.rstd, w); });
                     },
                     [x, w, gy, grads, dtype] {
                       // Per row, in float64: xhat = (x - mean) rstd, h = w gy,
                       // grad_x = rstd (h - mean(h) - xhat mean(h xhat)).
                       const int64_t cols = x.size(1);
                       return check_sampled(
                           grads->grad_x,
                           [&](std::span<const int64_t> c) {
                             double mean = 0, var = 0, mean_h = 0, mean_hx = 0;
                             for (int64_t j = 0; j < cols; ++j) mean += element_at(x, at2(c[0], j));
                             mean /= static_cast<double>(cols);
                             for (int64_t j = 0; j < cols; ++j) var += std::pow(element_at(x, at2(c[0], j)) - mean, 2);
                             const double rstd = 1 / std::sqrt(var / static_cast<double>(cols) + 1e-5);
                             auto h = [&](int64_t j) {
                               return element_at(w, std::vector<int64_t>{j}) * element_at(gy, at2(c[0], j));
                             };
                             auto xhat = [&](int64_t j) { return (element_at(x, at2(c[0], j)) - mean) * rstd; };
                             for (int64_t j = 0; j < cols; ++j) {
                               mean_h += h(j);
                               mean_hx += h(j) * xhat(j);
                             }
                             mean_h /= static_cast<double>(cols);
                             mean_hx /= static_cast<double>(cols);
                             return rstd * (h(c[1]) - mean_h - xhat(c[1]) * mean_hx);
                           },
                           1e-3, dtype == kBFloat16 ? 3e-2 : 1e-4);
                     });
               }});
    const Shape scores{s.tokens, s.ffn};
    suite.add({"softmax_backward", std::string(dtype_name(dtype)), shape_str(scores), [scores, dtype] {
                 Tensor y = softmax(pattern(scores, dtype, 34), -1), gy = pattern(scores, dtype, 35);
                 auto gx = std::make_shared<Tensor>(softmax_backward(gy, y, -1));
                 auto run = [gy, y, gx] { remake(*gx, [&] { return softmax_backward(gy, y, -1); }); };
                 return memcpy_case(3.0 * static_cast<double>(y.nbytes()), run, [y, gy, gx, dtype] {
                   // grad_x = y (grad_y - sum_j grad_y_j y_j), per row.
                   return check_sampled(
                       *gx,
                       [&](std::span<const int64_t> c) {
                         double dot = 0;
                         for (int64_t j = 0; j < y.size(1); ++j) {
                           dot += element_at(gy, at2(c[0], j)) * element_at(y, at2(c[0], j));
                         }
                         return element_at(y, c) * (element_at(gy, c) - dot);
                       },
                       1e-7, dtype == kBFloat16 ? 2e-2 : 1e-4);
                 });
               }});
  }
}

// The token embedding [vocab, hidden]: the forward gathers a row per token; the backward
// writes a new [vocab, hidden] gradient (zeros but for the tokens' rows), so its bytes are
// the whole table written plus the token gradients read.
void add_embedding_rows(Suite& suite, const Shapes& s) {
  const Shape table_shape{s.table, s.hidden};
  for (DType dtype : {kFloat32, kBFloat16}) {
    suite.add({"embedding", std::string(dtype_name(dtype)), fmt::format("{} tokens of {}", s.tokens, table_shape),
               [table_shape, dtype, tokens = s.tokens] {
                 Tensor table = pattern(table_shape, dtype, 41), index = random_indices(tokens, table_shape[0], 42);
                 auto out = std::make_shared<Tensor>(embedding(table, index));
                 return memcpy_case(
                     2.0 * static_cast<double>(out->nbytes()) + static_cast<double>(index.nbytes()),
                     [table, index, out] { remake(*out, [&] { return embedding(table, index); }); },
                     [table, index, out] {
                       return check_sampled(
                           *out,
                           [&](std::span<const int64_t> c) {
                             return element_at(table, at2(index.data_ptr<int64_t>()[c[0]], c[1]));
                           },
                           0.0, 0.0);
                     });
               }});
  }
  suite.add({"embedding_backward", "float32", fmt::format("{} tokens into {}", s.tokens, table_shape),
             [table_shape, tokens = s.tokens] {
               Tensor index = random_indices(tokens, table_shape[0], 43);
               Tensor grad = pattern({tokens, table_shape[1]}, kFloat32, 44);
               auto out = std::make_shared<Tensor>(embedding_backward(grad, index, table_shape[0]));
               auto tokens_of = std::make_shared<std::vector<std::vector<int64_t>>>(table_shape[0]);
               for (int64_t k = 0; k < tokens; ++k) (*tokens_of)[index.data_ptr<int64_t>()[k]].push_back(k);
               const double bytes = static_cast<double>(out->nbytes() + grad.nbytes() + index.nbytes());
               return memcpy_case(
                   bytes,
                   [grad, index, out, n = table_shape[0]] {
                     remake(*out, [&] { return embedding_backward(grad, index, n); });
                   },
                   [grad, out, tokens_of] {
                     return check_sampled(
                         *out,
                         [&](std::span<const int64_t> c) {
                           double sum = 0;
                           for (int64_t k : (*tokens_of)[c[0]]) sum += element_at(grad, at2(k, c[1]));
                           return sum;
                         },
                         1e-6, 1e-5);
                   });
             }});
}

// Dropout (p = 0.1) of the FFN activation [tokens, ffn]: the forward draws the mask
// (Philox per element), writes y and the bool mask; the backward reads grad_y and the mask.
void add_dropout_rows(Suite& suite, const Shapes& s) {
  const Shape shape{s.tokens, s.ffn};
  constexpr double p = 0.1;
  suite.add({"dropout", "float32", shape_str(shape), [shape] {
               Tensor x = pattern(shape, kFloat32, 51);
               auto out = std::make_shared<DropoutOutput>(dropout(x, p, 52));
               const double bytes = static_cast<double>(2 * x.nbytes() + out->mask.nbytes());
               return memcpy_case(
                   bytes, [x, out] { remake(*out, [&] { return dropout(x, p, 52); }); },
                   [x, out] {
                     // y is x / (1 - p) where the mask keeps it, else 0; about 1 - p of it is kept.
                     const Tensor kept = sum(out->mask);
                     const double fraction = kept.item() / static_cast<double>(x.numel());
                     if (std::abs(fraction - (1 - p)) > 1e-3) return fmt::format("kept {} of the elements", fraction);
                     return check_sampled(
                         out->y,
                         [&](std::span<const int64_t> c) {
                           return element_at(out->mask, c) != 0 ? element_at(x, c) / (1 - p) : 0.0;
                         },
                         1e-7, 1e-6);
                   });
             }});
  suite.add(
      {"dropout_backward", "float32", shape_str(shape), [shape] {
         Tensor gy = pattern(shape, kFloat32, 53);
         const Tensor mask = dropout(gy, p, 54).mask;
         auto gx = std::make_shared<Tensor>(dropout_backward(gy, mask, p));
         const double bytes = static_cast<double>(2 * gy.nbytes() + mask.nbytes());
         auto run = [gy, mask, gx] { remake(*gx, [&] { return dropout_backward(gy, mask, p); }); };
         return memcpy_case(bytes, run, [gy, mask, gx] {
           return check_sampled(
               *gx,
               [&](std::span<const int64_t> c) { return element_at(mask, c) != 0 ? element_at(gy, c) / (1 - p) : 0.0; },
               1e-7, 1e-6);
         });
       }});
}

// uniform_ and normal_ filling a [2 tokens, hidden] weight (a parameter's initialisation:
// 4 Mi draws at the full shapes). Each writes every element once; the check is statistical
// (the moments of the draws).
void add_random_rows(Suite& suite, const Shapes& s) {
  const Shape shape{2 * s.tokens, s.hidden};
  for (const char* op : {"uniform_", "normal_"}) {
    suite.add({op, "float32", shape_str(shape), [shape, normal = std::string(op) == "normal_"] {
                 Tensor t = Tensor::empty(shape);
                 auto run = [t, normal, seed = uint64_t{60}]() mutable {
                   ++seed;
                   if (normal) {
                     normal_(t, 0.0, 1.0, seed);
                   } else {
                     uniform_(t, 0.0, 1.0, seed);
                   }
                 };
                 return memcpy_case(static_cast<double>(t.nbytes()), run, [t, normal] {
                   // Mean and variance: 0 and 1 for normal, 1/2 and 1/12 for uniform [0, 1); with n
                   // draws each estimate is off by a few standard errors sigma / sqrt(n) at most.
                   const Tensor t64 = t.to(kFloat64);
                   const double* v = t64.data_ptr<double>();
                   const auto n = static_cast<double>(t.numel());
                   double sum = 0, squares = 0;
                   for (int64_t i = 0; i < t.numel(); ++i) sum += v[i];
                   const double mean = sum / n;
                   for (int64_t i = 0; i < t.numel(); ++i) squares += (v[i] - mean) * (v[i] - mean);
                   const double var = squares / n, want_mean = normal ? 0.0 : 0.5, want_var = normal ? 1.0 : 1.0 / 12;
                   const double tolerance = 6 * std::sqrt(want_var / n) + 6 * want_var * std::sqrt(2 / n);
                   if (std::abs(mean - want_mean) > tolerance || std::abs(var - want_var) > tolerance) {
                     return fmt::format("mean {} and variance {}; expected {} and {}", mean, var, want_mean, want_var);
                   }
                   return std::string();
                 });
               }});
  }
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
  if (const std::optional<int> exit_code = dtr::parse_command_line("kernel_bench", app, argc, argv)) return *exit_code;
  set_num_threads(threads > 0 ? threads : omp_get_num_procs());
  const Shapes& s = quick ? kQuickShapes : kFullShapes;
  // Other work on the machine steals cores from OpenMP's threads: print the load so a reader can judge.
  std::string load = "?";
  std::ifstream("/proc/loadavg") >> load;
  std::cout << fmt::format(
      "kernel_bench: {} threads, load average {}; tokens {}, hidden {}, ffn {}, vocab {}, optimizer params {} Mi{}\n",
      num_threads(), load, s.tokens, s.hidden, s.ffn, s.vocab, s.params >> 20, quick ? " (--quick)" : "");
  auto build = [](const Shapes& shapes) {
    Suite suite;
    add_memcpy_rows(suite, shapes);
    add_copy_rows(suite, shapes);
    add_fill_rows(suite, shapes);
    add_cat_rows(suite, shapes);
    add_index_rows(suite, shapes);
    add_elementwise_rows(suite, shapes);
    add_relu_mask_rows(suite, shapes);
    add_reduce_rows(suite, shapes);
    add_matmul_rows(suite, shapes);
    add_row_kernel_rows(suite, shapes);
    add_row_kernel_backward_rows(suite, shapes);
    add_embedding_rows(suite, shapes);
    add_dropout_rows(suite, shapes);
    add_random_rows(suite, shapes);
    add_optimizer_rows(suite, shapes);
    return suite;
  };
  const Suite suite = build(s);
  std::vector<Suite> twins;
  std::vector<const Suite*> in_cache;
  if (!quick) {
    for (const Shapes& shapes : kInCacheShapes) twins.push_back(build(shapes));
    for (const Suite& twin : twins) in_cache.push_back(&twin);
  }
  const int wrong = suite.run(filter, TimingOptions{}, std::cout, in_cache);
  if (wrong > 0) std::cout << wrong << " rows WRONG\n";
  return wrong > 0 ? 1 : 0;
}

}  // namespace
}  // namespace dtr::bench

int main(int argc, char** argv) {
  return dtr::tool_main("kernel_bench", [&] { return dtr::bench::run_main(argc, argv); });
}
