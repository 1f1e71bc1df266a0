// Fused attention on the CPU (kernels/attention.h), forward and backward, against the composed
// path in float64 (bmm, scale, causal masked_fill, softmax, bmm; backward softmax_backward and
// three more bmm): every floating dtype, causal or not, a shard of query rows (query_offset >
// 0, Tq < Tk), Tq != Tk, E != Ev, leading dims [2, 3] and none, query blocks' tails (Tq
// past 64), non-contiguous inputs (the heads' strided view of a projection among them),
// large logits, empty Tq and batch; a central finite
// difference of the float64 forward; an exact case compared bit for bit; thread-count
// independence; typed errors.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/softmax.h"
#include "tests/kernels/thread_count_guard.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_close;
using testing::check_equal;
using testing::random_normal;
using testing::to_f64;
using testing::Tolerance;

Shape concat(Shape lead, std::initializer_list<int64_t> tail) {
  lead.insert(lead.end(), tail);
  return lead;
}

struct Composed {
  Tensor out, lse, grad_q, grad_k, grad_v;  // float64, in the inputs' leading dims
};

// The op written with the unfused kernels, in float64 on [B, T, E] views of the inputs' values.
Composed composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out, Causal causal,
                  double scale, int64_t offset) {
  const int64_t tq = q.size(-2), tk = k.size(-2), e = q.size(-1), ev = v.size(-1);
  const Shape lead(q.shape().begin(), q.shape().end() - 2);
  const int64_t b = q.numel() == 0 ? 0 : q.numel() / (tq * e);
  const Tensor qd = q.to(kFloat64).reshape({b, tq, e}), kd = k.to(kFloat64).reshape({b, tk, e}),
               vd = v.to(kFloat64).reshape({b, tk, ev}), gd = grad_out.to(kFloat64).reshape({b, tq, ev});
  // scores [B, Tq, Tk] = q k^T * scale, masked where key j > offset + i
  Tensor scores = mul(bmm(qd, kd.transpose(1, 2)), scale);
  if (causal == Causal::kYes) {
    const Tensor rows = add(arange(0, static_cast<double>(tq), 1, kFloat64), static_cast<double>(offset)).unsqueeze(1);
    const Tensor cols = arange(0, static_cast<double>(tk), 1, kFloat64).unsqueeze(0);
    scores = masked_fill(scores, gt(cols, rows), -std::numeric_limits<double>::infinity());
  }
  const Tensor p = softmax(scores, -1);
  Composed c;
  c.out = bmm(p, vd).reshape(concat(lead, {tq, ev}));
  // lse = s_0 - log_softmax(s)_0: key 0 is seen by every row.
  c.lse = sub(scores.select(-1, 0), log_softmax(scores, -1).select(-1, 0)).reshape(concat(lead, {tq}));
  const Tensor dp = bmm(gd, vd.transpose(1, 2));                          // [B, Tq, Tk]
  const Tensor ds = softmax_backward(dp, p, -1);                          // [B, Tq, Tk]
  c.grad_q = mul(bmm(ds, kd), scale).reshape(q.shape());                  // [B, Tq, E]
  c.grad_k = mul(bmm(ds.transpose(1, 2), qd), scale).reshape(k.shape());  // [B, Tk, E]
  c.grad_v = bmm(p.transpose(1, 2), gd).reshape(v.shape());               // [B, Tk, Ev]
  return c;
}

// lse is float32 (float64 for float64 inputs): its tolerance is that dtype's.
Tolerance lse_tolerance(DType d) { return testing::tolerance_for(acc_dtype(d)); }

// Gradients sum Tk (or Tq) products of rounded inputs and out: a little looser than out.
Tolerance grad_tolerance(DType d) {
  Tolerance t = testing::tolerance_for(d);
  t.atol *= 2;
  t.rtol *= 2;
  return t;
}

struct Case {
  Shape lead;
  int64_t tq, tk, e, ev;
  Causal causal;
  int64_t offset;
};

std::string name_of(const Case& c, DType d) {
  return fmt::format("{} lead {} Tq {} Tk {} E {} Ev {} causal {} offset {}", dtype_name(d), c.lead, c.tq, c.tk, c.e,
                     c.ev, c.causal == Causal::kYes, c.offset);
}

// Runs the op and its backward on inputs drawn for case c and checks them against composed().
void check_case(const Case& c, DType d, uint64_t seed, double scale = 0.0) {
  const Tensor q = random_normal(concat(c.lead, {c.tq, c.e}), d, seed);
  const Tensor k = random_normal(concat(c.lead, {c.tk, c.e}), d, seed + 1);
  const Tensor v = random_normal(concat(c.lead, {c.tk, c.ev}), d, seed + 2);
  const Tensor g = random_normal(concat(c.lead, {c.tq, c.ev}), d, seed + 3);
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(c.e));
  const std::string what = name_of(c, d) + fmt::format(" scale {}", scale);
  const Composed ref = composed(q, k, v, g, c.causal, scale, c.offset);
  const AttentionOutput r = attention(q, k, v, c.causal, scale, c.offset);
  CHECK(r.out.shape() == concat(c.lead, {c.tq, c.ev}));
  CHECK(r.out.dtype() == d);
  CHECK(r.lse.shape() == concat(c.lead, {c.tq}));
  CHECK(r.lse.dtype() == acc_dtype(d));
  check_close(r.out, ref.out, "attention out " + what);
  check_close(r.lse, ref.lse, lse_tolerance(d), "attention lse " + what);
  const AttentionGrads gr = attention_backward(g, q, k, v, r.out, r.lse, c.causal, scale, c.offset);
  CHECK(gr.grad_q.shape() == q.shape());
  CHECK(gr.grad_k.shape() == k.shape());
  CHECK(gr.grad_v.shape() == v.shape());
  check_close(gr.grad_q, ref.grad_q, grad_tolerance(d), "attention grad_q " + what);
  check_close(gr.grad_k, ref.grad_k, grad_tolerance(d), "attention grad_k " + what);
  check_close(gr.grad_v, ref.grad_v, grad_tolerance(d), "attention grad_v " + what);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {{2, 3}, 5, 5, 8, 8, Causal::kNo, 0},   {{2, 3}, 7, 7, 16, 4, Causal::kYes, 0}, {{}, 1, 1, 4, 4, Causal::kYes, 0},
      {{}, 13, 70, 9, 11, Causal::kYes, 57},   // the last 13 query rows of 70
      {{2}, 20, 130, 8, 8, Causal::kYes, 40},  // a middle shard: rows see 41..60 of 130 keys
      {{}, 10, 12, 4, 4, Causal::kYes, 5},     // rows past the keys see them all
      {{3}, 33, 150, 12, 20, Causal::kNo, 0}, {{}, 70, 70, 5, 6, Causal::kYes, 0},    {{}, 17, 3, 6, 2, Causal::kNo, 0},
  };
  return all;
}

TEST_CASE("attention and its backward match the composed matmul/softmax path", "[attention]") {
  uint64_t seed = 1;
  for (DType d : testing::kFloatDTypes) {
    for (const Case& c : cases()) check_case(c, d, seed += 4);
  }
}

TEST_CASE("attention of large logits stays finite and accurate", "[attention]") {
  // scale 40 on q, k in multiples of 1/4: scores of several hundred (exp overflows without the
  // running max), yet exact in float, so out and lse meet the usual tolerances. At such scores
  // P = exp(s - lse) carries lse's own rounding (an ulp of ~300 in float32) times the scale
  // into the gradients, so these are checked against the float64 backward given the same out
  // and lse: the same function in exact arithmetic.
  auto quarters = [](const Shape& shape, DType d, uint64_t seed) {
    std::vector<double> x = to_f64(random_normal(shape, kFloat64, seed));
    for (double& e : x) e = std::round(e * 4) / 4;
    return Tensor::from_vector(x, shape).to(d);
  };
  uint64_t seed = 500;
  for (DType d : testing::kFloatDTypes) {
    for (const Case& c : {Case{{2}, 9, 80, 16, 8, Causal::kNo, 0}, Case{{}, 9, 80, 16, 8, Causal::kYes, 71}}) {
      const std::string what = name_of(c, d) + " scale 40";
      const Tensor q = quarters(concat(c.lead, {c.tq, c.e}), d, seed += 4);
      const Tensor k = quarters(concat(c.lead, {c.tk, c.e}), d, seed + 1);
      const Tensor v = random_normal(concat(c.lead, {c.tk, c.ev}), d, seed + 2);
      const Tensor g = random_normal(concat(c.lead, {c.tq, c.ev}), d, seed + 3);
      const Composed ref = composed(q, k, v, g, c.causal, 40.0, c.offset);
      const AttentionOutput r = attention(q, k, v, c.causal, 40.0, c.offset);
      const std::vector<double> lse = to_f64(ref.lse);
      REQUIRE(*std::max_element(lse.begin(), lse.end()) > 100.0);
      check_close(r.out, ref.out, "large-logit out " + what);
      check_close(r.lse, ref.lse, lse_tolerance(d), "large-logit lse " + what);
      const AttentionGrads gr = attention_backward(g, q, k, v, r.out, r.lse, c.causal, 40.0, c.offset);
      auto f64 = [](const Tensor& t) { return t.to(kFloat64); };
      const AttentionGrads exact =
          attention_backward(f64(g), f64(q), f64(k), f64(v), f64(r.out), f64(r.lse), c.causal, 40.0, c.offset);
      // dS = P (dP - D) cancels where P is near 1: float's rounding of dP and D (~1e-7 of ~3),
      // times the scale 40 and |k| ~ 3, reaches ~4e-5.
      Tolerance tol = grad_tolerance(d);
      if (d != kFloat64) tol.atol = std::max(tol.atol, 1e-4);
      check_close(gr.grad_q, exact.grad_q, tol, "large-logit grad_q " + what);
      check_close(gr.grad_k, exact.grad_k, tol, "large-logit grad_k " + what);
      check_close(gr.grad_v, exact.grad_v, tol, "large-logit grad_v " + what);
      if (d == kFloat64) check_close(gr.grad_q, ref.grad_q, grad_tolerance(d), "large-logit composed " + what);
    }
  }
}

TEST_CASE("attention takes non-contiguous inputs", "[attention]") {
  for (DType d : testing::kFloatDTypes) {
    const Shape lead{2, 3};
    // q [2, 3, 11, 8] as the transpose of a [2, 3, 8, 11] tensor; k, v, grad_out strided.
    const Tensor q = random_normal(concat(lead, {8, 11}), d, 11).transpose(-1, -2);
    const Tensor k = testing::strided_copy(random_normal(concat(lead, {19, 8}), d, 12));
    const Tensor v = testing::strided_copy(random_normal(concat(lead, {19, 5}), d, 13));
    const Tensor g = testing::strided_copy(random_normal(concat(lead, {11, 5}), d, 14));
    REQUIRE_FALSE(q.is_contiguous());
    REQUIRE_FALSE(k.is_contiguous());
    const double scale = 0.3;
    const AttentionOutput r = attention(q, k, v, Causal::kYes, scale, 8);
    const AttentionOutput rc = attention(q.contiguous(), k.contiguous(), v.contiguous(), Causal::kYes, scale, 8);
    check_equal(r.out, rc.out, "non-contiguous out");
    check_equal(r.lse, rc.lse, "non-contiguous lse");
    const Composed ref = composed(q, k, v, g, Causal::kYes, scale, 8);
    check_close(r.out, ref.out, fmt::format("{} transposed q out", dtype_name(d)));
    const AttentionGrads gr =
        attention_backward(g, q, k, v, testing::strided_copy(r.out), r.lse, Causal::kYes, scale, 8);
    const AttentionGrads gc = attention_backward(g.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), rc.out,
                                                 rc.lse, Causal::kYes, scale, 8);
    check_equal(gr.grad_q, gc.grad_q, "non-contiguous grad_q");
    check_equal(gr.grad_k, gc.grad_k, "non-contiguous grad_k");
    check_equal(gr.grad_v, gc.grad_v, "non-contiguous grad_v");
    check_close(gr.grad_q, ref.grad_q, grad_tolerance(d), "transposed q grad_q");

    // The heads' view of a projection, as MultiheadAttention passes them: [B, T, H, E]
    // transposed to [B, H, T, E], rows H x E apart and the leading dims not mergeable (float32
    // reads them in place): the same bits as contiguous copies.
    auto heads = [&](int64_t t, int64_t e, uint64_t seed) {
      return random_normal({2, t, 3, e}, d, seed).transpose(1, 2);
    };
    const Tensor hq = heads(11, 8, 21), hk = heads(19, 8, 22), hv = heads(19, 5, 23), hg = heads(11, 5, 24);
    const AttentionOutput hr = attention(hq, hk, hv, Causal::kYes, scale, 8);
    const AttentionOutput hc = attention(hq.contiguous(), hk.contiguous(), hv.contiguous(), Causal::kYes, scale, 8);
    check_equal(hr.out, hc.out, "heads' view out");
    check_equal(hr.lse, hc.lse, "heads' view lse");
    const AttentionGrads hgr = attention_backward(hg, hq, hk, hv, hr.out.transpose(1, 2).contiguous().transpose(1, 2),
                                                  hr.lse, Causal::kYes, scale, 8);
    const AttentionGrads hgc = attention_backward(hg.contiguous(), hq.contiguous(), hk.contiguous(), hv.contiguous(),
                                                  hc.out, hc.lse, Causal::kYes, scale, 8);
    check_equal(hgr.grad_q, hgc.grad_q, "heads' view grad_q");
    check_equal(hgr.grad_k, hgc.grad_k, "heads' view grad_k");
    check_equal(hgr.grad_v, hgc.grad_v, "heads' view grad_v");
  }
}

TEST_CASE("attention with equal scores averages the visible values exactly", "[attention][exact]") {
  // q = 0: every visible key weighs 1 / n, n = min(Tk, offset + i + 1) for causal row i.
  // v[j] = (j, 2 j): out_i = ((n - 1) / 2, n - 1), exactly representable; lse_i = log n.
  const int64_t tq = 5, tk = 10, offset = 3;
  std::vector<double> values;
  for (int64_t j = 0; j < tk; ++j) values.insert(values.end(), {static_cast<double>(j), 2.0 * j});
  for (DType d : testing::kFloatDTypes) {
    const Tensor q = zeros({tq, 4}, d), k = random_normal({tk, 4}, d, 3);
    const Tensor v = Tensor::from_vector(values, {tk, 2}).to(d);
    std::vector<double> out, lse;
    for (int64_t i = 0; i < tq; ++i) {
      const double n = static_cast<double>(std::min(tk, offset + i + 1));
      out.insert(out.end(), {(n - 1) / 2, n - 1});
      lse.push_back(std::log(n));
    }
    const AttentionOutput r = attention(q, k, v, Causal::kYes, 0.5, offset);
    check_equal(r.out, Shape{tq, 2}, out, fmt::format("{} equal scores, causal", dtype_name(d)));
    check_close(r.lse, Shape{tq}, lse, lse_tolerance(d), "lse of equal scores");
    std::vector<double> mean_all;
    for (int64_t i = 0; i < tq; ++i) mean_all.insert(mean_all.end(), {(tk - 1) / 2.0, tk - 1.0});
    check_equal(attention(q, k, v, Causal::kNo, 0.5).out, Shape{tq, 2}, mean_all,
                fmt::format("{} equal scores", dtype_name(d)));
  }
}

TEST_CASE("attention_backward equals a central finite difference of the float64 forward", "[attention][backward]") {
  // loss = sum(out * g); d loss / d x by (loss(x + h) - loss(x - h)) / 2h for every element.
  for (Causal causal : {Causal::kNo, Causal::kYes}) {
    const int64_t offset = causal == Causal::kYes ? 1 : 0;
    Tensor q = random_normal({2, 3, 3}, kFloat64, 40), k = random_normal({2, 4, 3}, kFloat64, 41),
           v = random_normal({2, 4, 2}, kFloat64, 42);
    const Tensor g = random_normal({2, 3, 2}, kFloat64, 43);
    const double scale = 0.7, h = 1e-6;
    auto loss = [&] {
      const std::vector<double> out = to_f64(attention(q, k, v, causal, scale, offset).out), gv = to_f64(g);
      double s = 0.0;
      for (size_t i = 0; i < out.size(); ++i) s += out[i] * gv[i];
      return s;
    };
    const AttentionOutput r = attention(q, k, v, causal, scale, offset);
    const AttentionGrads gr = attention_backward(g, q, k, v, r.out, r.lse, causal, scale, offset);
    for (auto [x, grad, name] :
         {std::tuple{&q, gr.grad_q, "grad_q"}, {&k, gr.grad_k, "grad_k"}, {&v, gr.grad_v, "grad_v"}}) {
      std::vector<double> numeric;
      double* p = x->data_ptr<double>();
      for (int64_t i = 0; i < x->numel(); ++i) {
        const double saved = p[i];
        p[i] = saved + h;
        const double up = loss();
        p[i] = saved - h;
        const double down = loss();
        p[i] = saved;
        numeric.push_back((up - down) / (2 * h));
      }
      check_close(grad, x->shape(), numeric, Tolerance{1e-7, 1e-6},
                  fmt::format("{} finite difference, causal {}", name, causal == Causal::kYes));
    }
  }
}

TEST_CASE("attention with no query rows or an empty batch gives empty outputs", "[attention]") {
  for (const Shape& lead : {Shape{2}, Shape{0, 3}}) {
    const int64_t tq = lead[0] == 0 ? 4 : 0;
    const Tensor q = Tensor::empty(concat(lead, {tq, 8})), k = random_normal(concat(lead, {5, 8}), kFloat32, 1),
                 v = random_normal(concat(lead, {5, 3}), kFloat32, 2);
    const AttentionOutput r = attention(q, k, v, Causal::kYes, 1.0);
    CHECK(r.out.shape() == concat(lead, {tq, 3}));
    CHECK(r.lse.shape() == concat(lead, {tq}));
    const AttentionGrads g = attention_backward(Tensor::empty(r.out.shape()), q, k, v, r.out, r.lse, Causal::kYes, 1.0);
    CHECK(g.grad_q.shape() == q.shape());
    check_equal(g.grad_k, zeros(k.shape(), kFloat64), "grad_k without queries");
    check_equal(g.grad_v, zeros(v.shape(), kFloat64), "grad_v without queries");
  }
}

TEST_CASE("attention is bitwise the same on any thread count", "[attention][determinism]") {
  const testing::ThreadCountGuard guard;
  for (DType d : {kFloat32, kBFloat16}) {
    const Tensor q = random_normal({4, 50, 16}, d, 60), k = random_normal({4, 90, 16}, d, 61),
                 v = random_normal({4, 90, 12}, d, 62), g = random_normal({4, 50, 12}, d, 63);
    auto run = [&](int threads) {
      set_num_threads(threads);
      const AttentionOutput r = attention(q, k, v, Causal::kYes, 0.25, 40);
      const AttentionGrads gr = attention_backward(g, q, k, v, r.out, r.lse, Causal::kYes, 0.25, 40);
      return std::vector<std::vector<double>>{to_f64(r.out), to_f64(r.lse), to_f64(gr.grad_q), to_f64(gr.grad_k),
                                              to_f64(gr.grad_v)};
    };
    const auto one = run(1), three = run(3);
    const char* names[] = {"out", "lse", "grad_q", "grad_k", "grad_v"};
    for (size_t i = 0; i < one.size(); ++i) {
      INFO(dtype_name(d) << " " << names[i]);
      CHECK(one[i] == three[i]);
    }
  }
}

TEST_CASE("attention rejects bad arguments with typed errors", "[attention][errors]") {
  using Catch::Contains;
  using Catch::Matches;
  const Tensor q = Tensor::empty({2, 4, 8}), k = Tensor::empty({2, 5, 8}), v = Tensor::empty({2, 5, 3});
  CHECK_THROWS_AS(attention(q, Tensor::empty({2, 5, 7}), v, Causal::kNo, 1.0), ValueError);
  CHECK_THROWS_WITH(attention(q, Tensor::empty({2, 5, 7}), v, Causal::kNo, 1.0),
                    Matches("attention: q float32\\[2, 4, 8\\], k float32\\[2, 5, 7\\], v float32\\[2, 5, 3\\] do "
                            "not fit; legal: .*"));
  CHECK_THROWS_AS(attention(q, Tensor::empty({3, 5, 8}), v, Causal::kNo, 1.0), ValueError);
  CHECK_THROWS_AS(attention(q, k, Tensor::empty({2, 6, 3}), Causal::kNo, 1.0), ValueError);
  CHECK_THROWS_AS(attention(Tensor::empty({8}), Tensor::empty({8}), Tensor::empty({8}), Causal::kNo, 1.0), ValueError);
  CHECK_THROWS_AS(attention(q, k.to(kFloat64), v, Causal::kNo, 1.0), TypeError);
  CHECK_THROWS_WITH(attention(q, k.to(kFloat64), v, Causal::kNo, 1.0),
                    Contains("attention") && Contains("float64[2, 5, 8]") && Contains("one floating dtype"));
  CHECK_THROWS_AS(attention(q.to(kInt64), k.to(kInt64), v.to(kInt64), Causal::kNo, 1.0), TypeError);
  CHECK_THROWS_WITH(attention(q, Tensor::empty({2, 0, 8}), Tensor::empty({2, 0, 3}), Causal::kNo, 1.0),
                    Contains("Tk = 0") && Contains("float32[2, 0, 8]"));
  CHECK_THROWS_AS(attention(Tensor::empty({2, 4, 0}), Tensor::empty({2, 5, 0}), v, Causal::kNo, 1.0), ValueError);
  CHECK_THROWS_WITH(attention(q, k, Tensor::empty({2, 5, 0}), Causal::kNo, 1.0), Contains("Ev = 0"));
  CHECK_THROWS_WITH(attention(q, k, v, Causal::kYes, 1.0, -1), Contains("attention: query_offset -1 must be >= 0"));
  CHECK_THROWS_WITH(attention(q, k, v, Causal::kNo, std::numeric_limits<double>::infinity()),
                    Contains("scale inf must be finite"));
  CHECK_THROWS_AS(attention(q, k, v, Causal::kNo, std::nan("")), ValueError);

  const AttentionOutput r = attention(random_normal({2, 4, 8}, kFloat32, 1), random_normal({2, 5, 8}, kFloat32, 2),
                                      random_normal({2, 5, 3}, kFloat32, 3), Causal::kNo, 1.0);
  const Tensor g = Tensor::empty({2, 4, 3});
  CHECK_THROWS_WITH(attention_backward(Tensor::empty({2, 4, 4}), q, k, v, r.out, r.lse, Causal::kNo, 1.0),
                    Contains("attention_backward: grad_out float32[2, 4, 4]") && Contains("float32[2, 4, 3]"));
  CHECK_THROWS_AS(attention_backward(g, q, k, v, r.out.to(kFloat64), r.lse, Causal::kNo, 1.0), ValueError);
  CHECK_THROWS_WITH(attention_backward(g, q, k, v, r.out, r.lse.to(kFloat64), Causal::kNo, 1.0),
                    Contains("attention_backward: lse float64[2, 4]") && Contains("saved float32[2, 4]"));
  CHECK_THROWS_AS(attention_backward(g, q, k, v, r.out, Tensor::empty({2, 5}), Causal::kNo, 1.0), ValueError);
  CHECK_THROWS_AS(attention_backward(g, q, k, v, r.out, r.lse, Causal::kYes, 1.0, -2), ValueError);
}

}  // namespace
}  // namespace dtr
