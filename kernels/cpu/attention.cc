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

// The sizes of one call and its causal rule.
struct Problem {
  int64_t batch, tq, tk, e, ev, offset;
  bool causal;
  // Query row i sees keys [0, key_end(i)).
  int64_t key_end(int64_t i) const { return causal ? std::min(tk, offset + i + 1) : tk; }
  int64_t blocks() const { return (tq + kQueryBlock - 1) / kQueryBlock; }
};

Problem problem_of(const Tensor& q, const Tensor& k, const Tensor& v, Causal causal, int64_t query_offset) {
  return {q.size(0), q.size(1), k.size(1), q.size(2), v.size(2), query_offset, causal == Causal::kYes};
}

// t in the compute type (float, double for float64), contiguous: this tensor when it already is.
Tensor as_acc(const Tensor& t) { return t.to(acc_dtype(t.dtype())).contiguous(); }

// An operand of product(): element (r, c) at data[r * rs + c * cs].
template <class Acc>
struct Operand {
  const Acc* data;
  int64_t rs, cs;
};

// c [m, n] (rows ldc apart) = alpha * a [m, k] b [k, n] + beta * c (c not read when beta is 0).
// Float runs dtr's GEMM (its summation order, gemm.h; inline when called on a kernel thread,
// threaded otherwise); double, the test dtype, a loop summing k in order.
template <class Acc>
void product(int64_t m, int64_t n, int64_t k, Operand<Acc> a, Operand<Acc> b, Acc* c, int64_t ldc, Acc alpha,
             Acc beta) {
  if constexpr (std::is_same_v<Acc, float>) {
    gemm(1, m, n, k, GemmMatrix<const float>{a.data, a.rs, a.cs, 0}, GemmMatrix<const float>{b.data, b.rs, b.cs, 0},
         GemmMatrix<float>{c, ldc, 1, 0}, {.alpha = alpha, .beta = beta});
  } else {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        Acc sum = 0;
        for (int64_t l = 0; l < k; ++l) sum += a.data[i * a.rs + l * a.cs] * b.data[l * b.rs + j * b.cs];
        Acc& out = c[i * ldc + j];
        out = beta == 0 ? alpha * sum : alpha * sum + beta * out;
      }
    }
  }
}

// d[r] = a_r . b_r for r < rows (rows of n values, n apart), summed in the order product()
// sums an element of C in: a batch of 1 x 1 products.
template <class Acc>
void row_dots(int64_t rows, int64_t n, const Acc* a, const Acc* b, Acc* d) {
  if constexpr (std::is_same_v<Acc, float>) {
    gemm(rows, 1, 1, n, GemmMatrix<const float>{a, n, 1, n}, GemmMatrix<const float>{b, 1, 1, n},
         GemmMatrix<float>{d, 1, 1, 1}, {});
  } else {
    for (int64_t r = 0; r < rows; ++r) product<Acc>(1, 1, n, {a + r * n, n, 1}, {b + r * n, 1, 1}, d + r, 1, 1, 0);
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
void scores(const Problem& p, const Block& blk, const Acc* q, const Acc* k, Acc scale, Acc* s) {
  product<Acc>(blk.rows, blk.keys, p.e, {q + (blk.b * p.tq + blk.i0) * p.e, p.e, 1}, {k + blk.b * p.tk * p.e, 1, p.e},
               s, blk.keys, scale, 0);
}

template <class T>
void forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const Problem& p,
             double scale) {
  using Acc = acc_t<T>;
  const Tensor qa = as_acc(q), ka = as_acc(k), va = as_acc(v);
  // float32 writes its output in place; other dtypes through an Acc buffer, rounded once.
  const Tensor oa = std::is_same_v<T, Acc> ? out : Tensor::empty(out.shape(), acc_dtype(out.dtype()));
  const Acc* pq = qa.data_ptr<Acc>();
  const Acc* pk = ka.data_ptr<Acc>();
  const Acc* pv = va.data_ptr<Acc>();
  Acc* po = oa.data_ptr<Acc>();
  Acc* pl = lse.data_ptr<Acc>();
  const int64_t blocks = p.blocks();
  parallel_for(p.batch * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<Acc> s(static_cast<size_t>(kQueryBlock * p.tk)), sums(static_cast<size_t>(kQueryBlock));
    for (int64_t w = begin; w < end; ++w) {
      const Block blk = block_of(p, w / blocks, w % blocks);
      scores<Acc>(p, blk, pq, pk, static_cast<Acc>(scale), s.data());
      // Each row becomes exp(s - max) over the keys it sees, summed in an order fixed by
      // their count (exp_sum.h), and 0 past them.
      for (int64_t r = 0; r < blk.rows; ++r) {
        Acc* sr = s.data() + r * blk.keys;
        const int64_t n = p.key_end(blk.i0 + r);
        const ExpSum<Acc> es = exp_sum<Acc>(sr, n, 1, sr);
        std::fill(sr + n, sr + blk.keys, Acc(0));
        sums[r] = es.sum;
        pl[blk.b * p.tq + blk.i0 + r] = es.max + std::log(es.sum);
      }
      // out_block [rows, Ev] = exp(s - max) v, each row divided by its sum (the division
      // last, as softmax's: equal scores average exactly).
      Acc* ob = po + (blk.b * p.tq + blk.i0) * p.ev;
      product<Acc>(blk.rows, p.ev, blk.keys, {s.data(), blk.keys, 1}, {pv + blk.b * p.tk * p.ev, p.ev, 1}, ob, p.ev, 1,
                   0);
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
  const Tensor qa = as_acc(q), ka = as_acc(k), va = as_acc(v), ga = as_acc(grad_out), oa = as_acc(out);
  const Tensor la = lse.contiguous();
  // The gradients accumulate in Acc: in place for float32, else in buffers rounded once.
  auto acc_of = [](const Tensor& g) {
    return std::is_same_v<T, Acc> ? g : Tensor::empty(g.shape(), acc_dtype(g.dtype()));
  };
  const Tensor gq = acc_of(grad_q), gk = acc_of(grad_k), gv = acc_of(grad_v);
  const Acc* pq = qa.data_ptr<Acc>();
  const Acc* pk = ka.data_ptr<Acc>();
  const Acc* pv = va.data_ptr<Acc>();
  const Acc* pg = ga.data_ptr<Acc>();
  const Acc* po = oa.data_ptr<Acc>();
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
    std::vector<Acc> prob(static_cast<size_t>(kQueryBlock * p.tk)), ds(prob.size());
    std::vector<Acc> delta(static_cast<size_t>(kQueryBlock));
    for (int64_t b = begin; b < end; ++b) {
      std::fill(pgk + b * p.tk * p.e, pgk + (b + 1) * p.tk * p.e, Acc(0));
      std::fill(pgv + b * p.tk * p.ev, pgv + (b + 1) * p.tk * p.ev, Acc(0));
      for (int64_t block = 0; block < blocks; ++block) {
        const Block blk = block_of(p, b, block);
        const int64_t row0 = b * p.tq + blk.i0;
        // P = exp(s - lse), 0 past a row's keys; s - lse <= 0 as in forward (lse >= max).
        scores<Acc>(p, blk, pq, pk, s_factor, prob.data());
        for (int64_t r = 0; r < blk.rows; ++r) {
          Acc* pr = prob.data() + r * blk.keys;
          const int64_t n = p.key_end(blk.i0 + r);
          const Acc l = pl[row0 + r];
#pragma omp simd
          for (int64_t c = 0; c < n; ++c) pr[c] = exp_nonpositive_of(std::min(pr[c] - l, Acc(0)));
          std::fill(pr + n, pr + blk.keys, Acc(0));
        }
        // delta = rowsum(dO out), summed as dP's elements are: where a row's P is one-hot,
        // out is that key's v and dS is exactly 0.
        row_dots<Acc>(blk.rows, p.ev, pg + row0 * p.ev, po + row0 * p.ev, delta.data());
        // dP [rows, keys] = dO_block v^T, then dS = P (dP - delta) in place.
        product<Acc>(blk.rows, blk.keys, p.ev, {pg + row0 * p.ev, p.ev, 1}, {pv + b * p.tk * p.ev, 1, p.ev}, ds.data(),
                     blk.keys, 1, 0);
        for (int64_t r = 0; r < blk.rows; ++r) {
          Acc* dr = ds.data() + r * blk.keys;
          const Acc* pr = prob.data() + r * blk.keys;
          const Acc dl = delta[r];
#pragma omp simd
          for (int64_t c = 0; c < blk.keys; ++c) dr[c] = pr[c] * (dr[c] - dl);
        }
        // grad_v[:keys] += P^T dO_block; grad_k[:keys] += scale dS^T q_block; grad_q_block = scale dS k.
        product<Acc>(blk.keys, p.ev, blk.rows, {prob.data(), 1, blk.keys}, {pg + row0 * p.ev, p.ev, 1},
                     pgv + b * p.tk * p.ev, p.ev, 1, 1);
        product<Acc>(blk.keys, p.e, blk.rows, {ds.data(), 1, blk.keys}, {pq + row0 * p.e, p.e, 1}, pgk + b * p.tk * p.e,
                     p.e, s_factor, 1);
        product<Acc>(blk.rows, p.e, blk.keys, {ds.data(), blk.keys, 1}, {pk + b * p.tk * p.e, p.e, 1}, pgq + row0 * p.e,
                     p.e, s_factor, 0);
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
