#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/internal/exp_sum.h"
#include "kernels/cpu/internal/vec_math.h"

namespace dtr::cpu {
namespace {

constexpr int64_t kQueryBlock = 64;  // query rows per block

// The sizes of one call (batch: the leading dims' product) and its causal rule.
struct Problem {
  int64_t batch, tq, tk, e, ev, offset;
  bool causal;
  // Query row i sees keys [0, key_end(i)).
  int64_t key_end(int64_t i) const { return causal ? std::min(tk, offset + i + 1) : tk; }
  int64_t blocks() const { return (tq + kQueryBlock - 1) / kQueryBlock; }
};

Problem problem_of(const Tensor& q, const Tensor& k, const Tensor& v, Causal causal, int64_t query_offset) {
  return {q.numel() / std::max<int64_t>(1, q.size(-2) * q.size(-1)),
          q.size(-2),
          k.size(-2),
          q.size(-1),
          v.size(-1),
          query_offset,
          causal == Causal::kYes};
}

// The [T, E] matrices of a [*, T, E] input, read in the compute type (float, double for
// float64): batch entry b's row t starts at at(b) + t * rs, its elements adjacent. The
// tensor itself where it already is such (float32 q, k and v as the heads' strided views of
// a projection: no copy), else a converted contiguous copy.
template <class Acc>
struct Rows {
  Tensor held;
  int64_t rs = 0;
  std::vector<int64_t> offsets;  // per batch entry, in elements
  const Acc* at(int64_t b) const { return held.data_ptr<Acc>() + offsets[static_cast<size_t>(b)]; }
};

template <class Acc>
Rows<Acc> rows_of(const Tensor& t) {
  const bool usable = t.dtype() == dtype_of<Acc>() && (t.size(-1) <= 1 || t.stride(-1) == 1);
  Rows<Acc> r{.held = usable ? t : t.to(dtype_of<Acc>()).contiguous()};
  const Tensor& x = r.held;
  r.rs = x.stride(-2);
  const int64_t lead = x.dim() - 2;
  int64_t batch = 1;
  for (int64_t d = 0; d < lead; ++d) batch *= x.size(d);
  r.offsets.resize(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    int64_t offset = 0;
    for (int64_t d = lead - 1, rest = b; d >= 0; --d) {
      offset += rest % x.size(d) * x.stride(d);
      rest /= x.size(d);
    }
    r.offsets[static_cast<size_t>(b)] = offset;
  }
  return r;
}

// A thread's scratch of n values, kept between calls (grow-only): the score blocks would
// otherwise be fresh pages, zeroed by the kernel, on every call.
template <class Acc>
Acc* scratch(int slot, int64_t n) {
  thread_local std::vector<Acc> buffers[3];
  std::vector<Acc>& b = buffers[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

// c [m, n] (rows ldc apart) = alpha * a [m, k] b [k, n] + beta * c (c not read when beta is 0),
// a and b as gemm.h's operands (one matrix: no batch stride). Float runs dtr's GEMM (its
// summation order; inline when called on a kernel thread, threaded otherwise); double, the
// test dtype, a loop summing k in order.
template <class Acc>
void product(int64_t m, int64_t n, int64_t k, GemmMatrix<const Acc> a, GemmMatrix<const Acc> b, Acc* c, int64_t ldc,
             Acc alpha, Acc beta) {
  if constexpr (std::is_same_v<Acc, float>) {
    gemm(1, m, n, k, a, b, GemmMatrix<float>{c, ldc}, {.alpha = alpha, .beta = beta});
  } else {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        Acc sum = 0;
        for (int64_t l = 0; l < k; ++l) {
          sum += a.data[i * a.row_stride + l * a.col_stride] * b.data[l * b.row_stride + j * b.col_stride];
        }
        Acc& out = c[i * ldc + j];
        out = beta == 0 ? alpha * sum : alpha * sum + beta * out;
      }
    }
  }
}

// d[r] = a_r . b_r for r < rows (rows of n values, as and bs apart), summed in the order
// product() sums an element of C in: a batch of 1 x 1 products.
template <class Acc>
void row_dots(int64_t rows, int64_t n, const Acc* a, int64_t as, const Acc* b, int64_t bs, Acc* d) {
  if constexpr (std::is_same_v<Acc, float>) {
    gemm(rows, 1, 1, n, GemmMatrix<const float>{a, n, 1, as}, GemmMatrix<const float>{b, 1, 1, bs},
         GemmMatrix<float>{d, 1, 1, 1}, {});
  } else {
    for (int64_t r = 0; r < rows; ++r) product<Acc>(1, 1, n, {a + r * as, n, 1}, {b + r * bs, 1, 1}, d + r, 1, 1, 0);
  }
}

// One query block: rows [i0, i0 + rows) of batch entry b, which together see keys [0, keys).
struct Block {
  int64_t b, i0, rows, keys;
};

Block block_of(const Problem& p, int64_t b, int64_t block) {
  const int64_t i0 = block * kQueryBlock, rows = std::min(kQueryBlock, p.tq - i0);
  return {b, i0, rows, p.key_end(i0 + rows - 1)};
}

// s [rows, keys] = scale * q_block k^T: the same call in forward and backward, so the
// backward's scores are the forward's bit for bit.
template <class Acc>
void scores(const Block& blk, const Rows<Acc>& q, const Rows<Acc>& k, int64_t e, Acc scale, Acc* s) {
  product<Acc>(blk.rows, blk.keys, e, {q.at(blk.b) + blk.i0 * q.rs, q.rs, 1}, {k.at(blk.b), 1, k.rs}, s, blk.keys,
               scale, 0);
}

template <class T>
void forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const Problem& p,
             double scale) {
  using Acc = acc_t<T>;
  const Rows<Acc> qa = rows_of<Acc>(q), ka = rows_of<Acc>(k), va = rows_of<Acc>(v);
  // float32 writes its output in place; other dtypes through an Acc buffer, rounded once.
  const Tensor oa = std::is_same_v<T, Acc> ? out : Tensor::empty(out.shape(), acc_dtype(out.dtype()));
  Acc* po = oa.data_ptr<Acc>();
  Acc* pl = lse.data_ptr<Acc>();
  const int64_t blocks = p.blocks();
  parallel_for(p.batch * blocks, 1, [&](int64_t begin, int64_t end) {
    Acc* s = scratch<Acc>(0, kQueryBlock * p.tk);
    Acc* sums = scratch<Acc>(1, kQueryBlock);
    for (int64_t w = begin; w < end; ++w) {
      const Block blk = block_of(p, w / blocks, w % blocks);
      scores<Acc>(blk, qa, ka, p.e, static_cast<Acc>(scale), s);
      // Each row becomes exp(s - max) over the keys it sees, summed in an order fixed by
      // their count (exp_sum.h), and 0 past them.
      for (int64_t r = 0; r < blk.rows; ++r) {
        Acc* sr = s + r * blk.keys;
        const int64_t n = p.key_end(blk.i0 + r);
        const ExpSum<Acc> es = exp_sum<Acc>(sr, n, 1, sr);
        std::fill(sr + n, sr + blk.keys, Acc(0));
        sums[r] = es.sum;
        pl[blk.b * p.tq + blk.i0 + r] = es.max + std::log(es.sum);
      }
      // out_block [rows, Ev] = exp(s - max) v, each row divided by its sum (the division
      // last, as softmax's: equal scores average exactly).
      Acc* ob = po + (blk.b * p.tq + blk.i0) * p.ev;
      product<Acc>(blk.rows, p.ev, blk.keys, {s, blk.keys, 1}, {va.at(blk.b), va.rs, 1}, ob, p.ev, 1, 0);
      for (int64_t r = 0; r < blk.rows; ++r) {
        Acc* orow = ob + r * p.ev;
        const Acc sum = sums[r];
#pragma omp simd
        for (int64_t c = 0; c < p.ev; ++c) orow[c] /= sum;
      }
    }
  });
  if (!std::is_same_v<T, Acc>) Tensor(out).copy_(oa);
}

template <class T>
void backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out, const Tensor& q,
              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Problem& p, double scale) {
  using Acc = acc_t<T>;
  const Rows<Acc> qa = rows_of<Acc>(q), ka = rows_of<Acc>(k), va = rows_of<Acc>(v), ga = rows_of<Acc>(grad_out),
                  oa = rows_of<Acc>(out);
  const Tensor la = lse.contiguous();
  // The gradients accumulate in Acc: in place for float32, else in buffers rounded once.
  auto acc_of = [](const Tensor& g) {
    return std::is_same_v<T, Acc> ? g : Tensor::empty(g.shape(), acc_dtype(g.dtype()));
  };
  const Tensor gq = acc_of(grad_q), gk = acc_of(grad_k), gv = acc_of(grad_v);
  const Acc* pl = la.data_ptr<Acc>();
  Acc* pgq = gq.data_ptr<Acc>();
  Acc* pgk = gk.data_ptr<Acc>();
  Acc* pgv = gv.data_ptr<Acc>();
  const Acc s_factor = static_cast<Acc>(scale);
  const int64_t blocks = p.blocks();

  // A thread takes whole batch entries, so grad_k and grad_v sum the query blocks in order:
  // grad_k[j] = sum over blocks of scale * dS_block^T q_block, from zero (keys no row sees
  // stay 0), and grad_v the same with P and dO.
  parallel_for(p.batch, 1, [&](int64_t begin, int64_t end) {
    Acc* prob = scratch<Acc>(0, kQueryBlock * p.tk);
    Acc* ds = scratch<Acc>(1, kQueryBlock * p.tk);
    Acc* delta = scratch<Acc>(2, kQueryBlock);
    for (int64_t b = begin; b < end; ++b) {
      std::fill(pgk + b * p.tk * p.e, pgk + (b + 1) * p.tk * p.e, Acc(0));
      std::fill(pgv + b * p.tk * p.ev, pgv + (b + 1) * p.tk * p.ev, Acc(0));
      for (int64_t block = 0; block < blocks; ++block) {
        const Block blk = block_of(p, b, block);
        const int64_t row0 = b * p.tq + blk.i0;
        const Acc* q_blk = qa.at(b) + blk.i0 * qa.rs;
        const Acc* g_blk = ga.at(b) + blk.i0 * ga.rs;
        // P = exp(s - lse), 0 past a row's keys; s - lse <= 0 as in forward (lse >= max).
        scores<Acc>(blk, qa, ka, p.e, s_factor, prob);
        for (int64_t r = 0; r < blk.rows; ++r) {
          Acc* pr = prob + r * blk.keys;
          const int64_t n = p.key_end(blk.i0 + r);
          const Acc l = pl[row0 + r];
#pragma omp simd
          for (int64_t c = 0; c < n; ++c) pr[c] = exp_nonpositive_of(std::min(pr[c] - l, Acc(0)));
          std::fill(pr + n, pr + blk.keys, Acc(0));
        }
        // delta = rowsum(dO out), summed as dP's elements are: where a row's P is one-hot,
        // out is that key's v and dS is exactly 0.
        row_dots<Acc>(blk.rows, p.ev, g_blk, ga.rs, oa.at(b) + blk.i0 * oa.rs, oa.rs, delta);
        // dP [rows, keys] = dO_block v^T, then dS = P (dP - delta) in place.
        product<Acc>(blk.rows, blk.keys, p.ev, {g_blk, ga.rs, 1}, {va.at(b), 1, va.rs}, ds, blk.keys, 1, 0);
        for (int64_t r = 0; r < blk.rows; ++r) {
          Acc* dr = ds + r * blk.keys;
          const Acc* pr = prob + r * blk.keys;
          const Acc dl = delta[r];
#pragma omp simd
          for (int64_t c = 0; c < blk.keys; ++c) dr[c] = pr[c] * (dr[c] - dl);
        }
        // grad_v[:keys] += P^T dO_block; grad_k[:keys] += scale dS^T q_block; grad_q_block = scale dS k.
        product<Acc>(blk.keys, p.ev, blk.rows, {prob, 1, blk.keys}, {g_blk, ga.rs, 1}, pgv + b * p.tk * p.ev, p.ev, 1,
                     1);
        product<Acc>(blk.keys, p.e, blk.rows, {ds, 1, blk.keys}, {q_blk, qa.rs, 1}, pgk + b * p.tk * p.e, p.e, s_factor,
                     1);
        product<Acc>(blk.rows, p.e, blk.keys, {ds, blk.keys, 1}, {ka.at(b), ka.rs, 1}, pgq + row0 * p.e, p.e, s_factor,
                     0);
      }
    }
  });
  if (!std::is_same_v<T, Acc>) {
    Tensor(grad_q).copy_(gq);
    Tensor(grad_k).copy_(gk);
    Tensor(grad_v).copy_(gv);
  }
}

}  // namespace

void attention(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, Causal causal,
               double scale, int64_t query_offset) {
  const Problem p = problem_of(q, k, v, causal, query_offset);
  dispatch_floating(q.dtype(), "attention", [&]<class T>(TypeTag<T>) { forward<T>(out, lse, q, k, v, p, scale); });
}

void attention_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        Causal causal, double scale, int64_t query_offset) {
  const Problem p = problem_of(q, k, v, causal, query_offset);
  dispatch_floating(q.dtype(), "attention_backward", [&]<class T>(TypeTag<T>) {
    backward<T>(grad_q, grad_k, grad_v, grad_out, q, k, v, out, lse, p, scale);
  });
}

}  // namespace dtr::cpu
