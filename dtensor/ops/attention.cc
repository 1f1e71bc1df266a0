#include "dtensor/ops/attention.h"

#include <cmath>
#include <limits>

#include "core/trace.h"
#include "dtensor/autograd.h"
#include "dtensor/kept_outputs.h"
#include "dtensor/ops/elementwise.h"
#include "dtensor/ops/matmul.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/softmax.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"

namespace dtr {

DTensor causal_mask_fill(const DTensor& x, double value) {
  const int64_t nd = x.dim();
  DTR_CHECK(nd >= 2, ValueError, "causal_mask_fill: input {} must have at least 2 dims [..., Tq, Tk]", describe(x));
  std::vector<DimStrategy> per_dim = elementwise_strategies({x.shape()}, x.shape());
  if (value == 0.0) add_linear_partials(per_dim, 1, 0);
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy("causal_mask_fill", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  const Tensor& local = s.inputs[0].to_local();
  const LocalChunk chunk = s.inputs[0].spec().local_chunk();
  // masked[i][j] = (col0 + j > row0 + i) for this rank's chunk of rows and columns.
  const double row0 = static_cast<double>(chunk.offset[nd - 2]), col0 = static_cast<double>(chunk.offset[nd - 1]);
  const Tensor rows =
      arange(row0, row0 + static_cast<double>(local.size(-2)), 1.0, kInt64, local.device()).unsqueeze(1);
  const Tensor cols =
      arange(col0, col0 + static_cast<double>(local.size(-1)), 1.0, kInt64, local.device()).unsqueeze(0);
  DTensor y = make_output(masked_fill(local, gt(cols, rows), value), x.mesh(), s.strategy.outputs[0], x.shape());
  record("causal_mask_fill", s.inputs, std::span(&y, 1),
         [](const std::vector<DTensor>& g) { return std::vector<DTensor>{causal_mask_fill(g[0], 0.0)}; });
  return y;
}

// The header's rule: each rank's chunks are whole attention problems.
bool fused_attention_fits(const DTensor& q, const DTensor& k, const DTensor& v) {
  if (!(k.mesh() == q.mesh() && v.mesh() == q.mesh())) return false;
  const int64_t nd = q.dim();
  auto dim_of = [nd](const Placement& p) { return p.shard_dim() < 0 ? p.shard_dim() + nd : p.shard_dim(); };
  for (size_t m = 0; m < q.placements().size(); ++m) {
    const Placement &pq = q.placements()[m], &pk = k.placements()[m], &pv = v.placements()[m];
    const bool all_replicate = pq.is_replicate() && pk.is_replicate() && pv.is_replicate();
    const bool same_leading = pq.is_shard() && pk == pq && pv == pq && dim_of(pq) < nd - 2;
    const bool query_rows = pq.is_shard() && dim_of(pq) == nd - 2 && pk.is_replicate() && pv.is_replicate();
    if (!all_replicate && !same_leading && !query_rows) return false;
  }
  return true;
}

namespace {

// The fused kernel on local chunks, and its backward: grad_q placed like q, grad_k and
// grad_v like k and v but Partial(sum) where q's rows are sharded (each rank's queries
// contribute to every key's gradient).
DTensor fused_attention(const DTensor& q, const DTensor& k, const DTensor& v, Causal causal, double scale) {
  const int64_t nd = q.dim();
  const int64_t query_offset = q.spec().local_chunk().offset[nd - 2];
  std::vector<Tensor> fwd = kept_or_computed("scaled_dot_product_attention", [&] {
    AttentionOutput o = attention(q.to_local(), k.to_local(), v.to_local(), causal, scale, query_offset);
    return std::vector{std::move(o.out), std::move(o.lse)};
  });
  Shape out_shape = q.shape();
  out_shape.back() = v.size(-1);
  DTensor y = make_output(fwd[0], q.mesh(), q.placements(), std::move(out_shape));
  const DTensor inputs[] = {q, k, v};
  Placements kv_grad = k.placements();
  for (size_t m = 0; m < kv_grad.size(); ++m) {
    if (q.placements()[m].is_shard() && !k.placements()[m].is_shard()) kv_grad[m] = Partial();
  }
  record("scaled_dot_product_attention", inputs, std::span(&y, 1),
         [q = q.detach(), k = k.detach(), v = v.detach(), out = y.detach(), lse = fwd[1], causal, scale, query_offset,
          kv_grad](const std::vector<DTensor>& g) {
           const Tensor grad_out = g[0].redistribute(out.placements()).to_local();
           AttentionGrads grads = attention_backward(grad_out, q.to_local(), k.to_local(), v.to_local(), out.to_local(),
                                                     lse, causal, scale, query_offset);
           return std::vector<DTensor>{make_output(grads.grad_q, q.mesh(), q.placements(), q.shape()),
                                       make_output(grads.grad_k, k.mesh(), kv_grad, k.shape()),
                                       make_output(grads.grad_v, v.mesh(), kv_grad, v.shape())};
         });
  return y;
}

std::string placements_of(const DTensor& q, const DTensor& k, const DTensor& v) {
  auto str = [](const DTensor& t) {
    std::string s;
    for (const Placement& p : t.placements()) s += (s.empty() ? "" : ", ") + p.str();
    return "[" + s + "]";
  };
  return fmt::format("q {}, k {}, v {}", str(q), str(k), str(v));
}

}  // namespace

DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v, Causal causal,
                                     std::optional<double> scale, AttentionBackend backend) {
  auto leading = [](const DTensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); };
  const bool fits = q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim() && leading(k) == leading(q) &&
                    leading(v) == leading(q) && k.size(-1) == q.size(-1) && v.size(-2) == k.size(-2);
  DTR_CHECK(fits, ValueError,
            "scaled_dot_product_attention: q {}, k {}, v {} do not fit; legal: q [*, Tq, E], k [*, Tk, E], "
            "v [*, Tk, Ev] with the same leading dims *",
            describe(q), describe(k), describe(v));
  DTR_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype() && is_floating(q.dtype()), TypeError,
            "scaled_dot_product_attention: q {}, k {}, v {} must share one floating dtype", describe(q), describe(k),
            describe(v));
  const trace::Region region("attention");  // its backward nodes too (train_step_bench's split)
  const double factor = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const bool can_fuse = fused_attention_fits(q, k, v);
  DTR_CHECK(backend != AttentionBackend::kFused || can_fuse, ValueError,
            "scaled_dot_product_attention: the fused backend needs each rank's chunks to be whole problems (on "
            "every mesh dim q, k, v Replicate or Shard of one leading dim, or q Shard(-2) with k, v Replicate); "
            "got {} on {}",
            placements_of(q, k, v), q.mesh());
  const bool fuse = backend == AttentionBackend::kFused || (backend == AttentionBackend::kAuto && can_fuse);
  if (fuse) return fused_attention(q, k, v, causal, factor);
  // The composed path's products are attention's own: selective checkpointing keeps the
  // fused kernel's result, but nothing of these (their backward needs the [Tq, Tk]
  // probabilities, which would cost more to keep than to recompute).
  const KeptOutputs::Scope not_kept(nullptr, KeptOutputs::Mode::kRecord);
  // scores [*, Tq, Tk] = (q [*, Tq, E] * scale) @ k^T [*, E, Tk]: q scaled, a pass over
  // Tq x E elements instead of Tq x Tk (at Tk 512 and E 64, 8 times fewer).
  DTensor scores = matmul(mul(q, factor), transpose(k, -2, -1));
  if (causal == Causal::kYes) scores = causal_mask_fill(scores, -std::numeric_limits<double>::infinity());
  // out [*, Tq, Ev] = softmax(scores) [*, Tq, Tk] @ v [*, Tk, Ev]
  return matmul(softmax(scores, -1), v);
}

}  // namespace dtr
