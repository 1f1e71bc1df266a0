#include "dtensor/ops/attention.h"

#include <cmath>
#include <limits>

#include "dtensor/autograd.h"
#include "dtensor/ops/matmul.h"
#include "dtensor/ops/op_util.h"
#include "dtensor/ops/pointwise.h"
#include "dtensor/ops/softmax.h"
#include "dtensor/ops/view_ops.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "kernels/trace.h"

namespace dtr {

DTensor causal_mask_fill(const DTensor& x, double value) {
  const int64_t nd = x.dim();
  DTR_CHECK(nd >= 2, ValueError, "causal_mask_fill: input {} must have at least 2 dims [..., Tq, Tk]", describe(x));
  std::vector<DimStrategy> per_dim = pointwise_strategies({x.shape()}, x.shape());
  if (value == 0.0) add_linear_partials(per_dim, 1, 0);
  const DTensor inputs[] = {x};
  AppliedStrategy s = apply_strategy("causal_mask_fill", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  const Tensor& local = s.inputs[0].to_local();
  const LocalBox box = s.inputs[0].spec().local_box();
  // masked[i][j] = (col0 + j > row0 + i) for this rank's block of rows and columns.
  const double row0 = static_cast<double>(box.offset[nd - 2]), col0 = static_cast<double>(box.offset[nd - 1]);
  const Tensor rows = arange(row0, row0 + static_cast<double>(local.size(-2))).unsqueeze(1);
  const Tensor cols = arange(col0, col0 + static_cast<double>(local.size(-1))).unsqueeze(0);
  DTensor y = make_output(masked_fill(local, gt(cols, rows), value), x.mesh(), s.strategy.outputs[0], x.shape());
  record("causal_mask_fill", s.inputs, std::span(&y, 1),
         [](const std::vector<DTensor>& g) { return std::vector<DTensor>{causal_mask_fill(g[0], 0.0)}; });
  return y;
}

DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v, Causal causal,
                                     std::optional<double> scale) {
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
  // scores [*, Tq, Tk] = q [*, Tq, E] @ k^T [*, E, Tk] * scale
  DTensor scores = mul(matmul(q, transpose(k, -2, -1)), factor);
  if (causal == Causal::kYes) scores = causal_mask_fill(scores, -std::numeric_limits<double>::infinity());
  // out [*, Tq, Ev] = softmax(scores) [*, Tq, Tk] @ v [*, Tk, Ev]
  return matmul(softmax(scores, -1), v);
}

}  // namespace dtr
