#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/internal/lane_fold.h"

namespace dtr::cpu {
namespace {

constexpr int64_t kQueryBlock = 16;  // query rows per forward work item
constexpr int64_t kKeyTile = 64;     // keys per online-softmax step

// The sizes of one call and its causal rule.
struct Problem {
  int64_t batch, tq, tk, e, ev, offset;
  bool causal;
  // Query row i sees keys [0, key_end(i)).
  int64_t key_end(int64_t i) const { return causal ? std::min(tk, offset + i + 1) : tk; }
  // Key j is seen by query rows [query_begin(j), tq).
  int64_t query_begin(int64_t j) const { return causal ? std::clamp<int64_t>(j - offset, 0, tq) : 0; }
};

Problem problem_of(const Tensor& q, const Tensor& k, const Tensor& v, Causal causal, int64_t query_offset) {
  return {q.size(0), q.size(1), k.size(1), q.size(2), v.size(2), query_offset, causal == Causal::kYes};
}

// t in the compute type (float, double for float64), contiguous: this tensor when it already is.
Tensor as_acc(const Tensor& t) { return t.to(acc_dtype(t.dtype())).contiguous(); }

// a . b over n elements, in lanes (lane_fold.h): the order depends on n alone.
template <class Acc>
Acc dot(const Acc* a, const Acc* b, int64_t n) {
  return lane_sum<Acc>(n, [&](int64_t c) { return a[c] * b[c]; });
}

template <class T>
void forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const Problem& p,
             double scale) {
  using Acc = acc_t<T>;
  const Tensor qa = as_acc(q), ka = as_acc(k), va = as_acc(v);
  const Acc* pq = qa.data_ptr<Acc>();
  const Acc* pk = ka.data_ptr<Acc>();
  const Acc* pv = va.data_ptr<Acc>();
  T* po = out.data_ptr<T>();
  Acc* pl = lse.data_ptr<Acc>();
  const Acc s = static_cast<Acc>(scale);
  const int64_t blocks = (p.tq + kQueryBlock - 1) / kQueryBlock;
  parallel_for(p.batch * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<Acc> scores(kKeyTile), acc(static_cast<size_t>(kQueryBlock * p.ev));
    Acc m[kQueryBlock], l[kQueryBlock];  // per row: running max and sum of exp(score - max)
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / blocks, i0 = (w % blocks) * kQueryBlock, i1 = std::min(p.tq, i0 + kQueryBlock);
      std::fill(acc.begin(), acc.end(), Acc(0));
      std::fill(m, m + kQueryBlock, -std::numeric_limits<Acc>::infinity());
      std::fill(l, l + kQueryBlock, Acc(0));
      // Key tiles start at multiples of kKeyTile, so a row's sequence of operations depends on
      // the row alone (not on the block or thread that runs it).
      for (int64_t j0 = 0; j0 < p.key_end(i1 - 1); j0 += kKeyTile) {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t j1 = std::min(j0 + kKeyTile, p.key_end(i));
          if (j1 <= j0) continue;  // this row sees none of the tile's keys
          const Acc* qi = pq + (b * p.tq + i) * p.e;
          Acc mx = -std::numeric_limits<Acc>::infinity();
          for (int64_t j = j0; j < j1; ++j) {
            scores[j - j0] = dot(qi, pk + (b * p.tk + j) * p.e, p.e) * s;
            mx = std::max(mx, scores[j - j0]);
          }
          const int64_t r = i - i0;
          const Acc m_new = std::max(m[r], mx);
          const Acc alpha = std::exp(m[r] - m_new);  // 0 on the row's first tile (m = -inf)
          Acc* ai = acc.data() + r * p.ev;
          for (int64_t c = 0; c < p.ev; ++c) ai[c] *= alpha;
          l[r] *= alpha;
          for (int64_t j = j0; j < j1; ++j) {
            const Acc pj = std::exp(scores[j - j0] - m_new);
            const Acc* vj = pv + (b * p.tk + j) * p.ev;
            l[r] += pj;
            for (int64_t c = 0; c < p.ev; ++c) ai[c] += pj * vj[c];
          }
          m[r] = m_new;
        }
      }
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t r = i - i0;
        const Acc* ai = acc.data() + r * p.ev;
        T* oi = po + (b * p.tq + i) * p.ev;
        for (int64_t c = 0; c < p.ev; ++c) oi[c] = convert<T>(ai[c] / l[r]);
        pl[b * p.tq + i] = m[r] + std::log(l[r]);
      }
    }
  });
}

template <class T>
void backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out, const Tensor& q,
              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Problem& p, double scale) {
  using Acc = acc_t<T>;
  const Tensor qa = as_acc(q), ka = as_acc(k), va = as_acc(v), ga = as_acc(grad_out), oa = as_acc(out);
  const Tensor la = lse.contiguous();
  const Acc* pq = qa.data_ptr<Acc>();
  const Acc* pk = ka.data_ptr<Acc>();
  const Acc* pv = va.data_ptr<Acc>();
  const Acc* pg = ga.data_ptr<Acc>();
  const Acc* po = oa.data_ptr<Acc>();
  const Acc* pl = la.data_ptr<Acc>();
  T* pgq = grad_q.data_ptr<T>();
  T* pgk = grad_k.data_ptr<T>();
  T* pgv = grad_v.data_ptr<T>();
  const Acc s = static_cast<Acc>(scale);
  const int64_t rows = p.batch * p.tq, keys = p.batch * p.tk;

  // delta [B * Tq] = rowsum(grad_out * out)
  std::vector<Acc> delta(static_cast<size_t>(rows));
  parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(p.ev, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) delta[r] = dot(pg + r * p.ev, po + r * p.ev, p.ev);
  });

  // dS_ij = P_ij (dO_i . v_j - delta_i), P_ij = exp(q_i . k_j * scale - lse_i): the same
  // sequence of operations in both passes below.
  auto ds_of = [&](int64_t b, int64_t i, int64_t j, Acc& prob) {
    const int64_t row = b * p.tq + i, key = b * p.tk + j;
    prob = std::exp(dot(pq + row * p.e, pk + key * p.e, p.e) * s - pl[row]);
    return prob * (dot(pg + row * p.ev, pv + key * p.ev, p.ev) - delta[row]);
  };

  // grad_q [B, Tq, E]: row i = scale * sum_j dS_ij k_j, j over the keys it sees, in order.
  const int64_t pair_grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, p.tk * (p.e + p.ev)));
  parallel_for(rows, pair_grain, [&](int64_t begin, int64_t end) {
    std::vector<Acc> gq(static_cast<size_t>(p.e));
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / p.tq, i = row % p.tq;
      std::fill(gq.begin(), gq.end(), Acc(0));
      for (int64_t j = 0; j < p.key_end(i); ++j) {
        Acc prob;
        const Acc ds = ds_of(b, i, j, prob);
        const Acc* kj = pk + (b * p.tk + j) * p.e;
        for (int64_t c = 0; c < p.e; ++c) gq[c] += ds * kj[c];
      }
      for (int64_t c = 0; c < p.e; ++c) pgq[row * p.e + c] = convert<T>(gq[c] * s);
    }
  });

  // grad_k [B, Tk, E] = scale * sum_i dS_ij q_i and grad_v [B, Tk, Ev] = sum_i P_ij dO_i, i
  // over the query rows that see key j, in order: split by key rows, so no two threads add
  // into one element.
  const int64_t key_grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, p.tq * (p.e + p.ev)));
  parallel_for(keys, key_grain, [&](int64_t begin, int64_t end) {
    std::vector<Acc> gk(static_cast<size_t>(p.e)), gv(static_cast<size_t>(p.ev));
    for (int64_t key = begin; key < end; ++key) {
      const int64_t b = key / p.tk, j = key % p.tk;
      std::fill(gk.begin(), gk.end(), Acc(0));
      std::fill(gv.begin(), gv.end(), Acc(0));
      for (int64_t i = p.query_begin(j); i < p.tq; ++i) {
        Acc prob;
        const Acc ds = ds_of(b, i, j, prob);
        const Acc* qi = pq + (b * p.tq + i) * p.e;
        const Acc* gi = pg + (b * p.tq + i) * p.ev;
        for (int64_t c = 0; c < p.e; ++c) gk[c] += ds * qi[c];
        for (int64_t c = 0; c < p.ev; ++c) gv[c] += prob * gi[c];
      }
      for (int64_t c = 0; c < p.e; ++c) pgk[key * p.e + c] = convert<T>(gk[c] * s);
      for (int64_t c = 0; c < p.ev; ++c) pgv[key * p.ev + c] = convert<T>(gv[c]);
    }
  });
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
