#include "dtensor/ops/dropout.h"

#include "dtensor/autograd.h"
#include "dtensor/ops/op_util.h"
#include "kernels/block_reduce.h"
#include "kernels/dropout.h"

namespace dtr {

DTensor dropout(const DTensor& x, double p, uint64_t seed) {
  DTR_CHECK(is_floating(x.dtype()), TypeError,
            "dropout: input {} is not floating; it takes float32, float64, bfloat16 or float16", describe(x));
  DTR_CHECK(p >= 0.0 && p <= 1.0, ValueError, "dropout: p = {} for {}; the drop probability must lie in [0, 1]", p,
            describe(x));
  const DTensor inputs[] = {x};
  const std::vector<DimStrategy> per_dim = elementwise_strategies({x.shape()}, x.shape(), kLinearReduceOps);
  AppliedStrategy s = apply_strategy("dropout", inputs, expand_strategies(per_dim, x.mesh().ndim()));
  const DTensor& moved = s.inputs[0];
  ShardLayout layout{x.shape(), moved.spec().local_chunk().offset};
  // A micro-batch's tensor is drawn at its place in the step's batch (kernels/block_reduce.h).
  if (const BatchWindow w = batch_window(); w.total > 0 && x.dim() >= 2 && x.size(0) == w.count) {
    const int64_t rows = moved.to_local().size(0), offset = layout.offset[0];
    DTR_CHECK(w.rank_stride == 0 || rows == 0 || offset % w.rank_rows + rows <= w.rank_rows, ValueError,
              "dropout: {}'s local rows {}..{} straddle two data-parallel ranks' shares ({} rows each) of a "
              "rank-major micro-batch; split dim 0 over the data-parallel ranks",
              describe(x), offset, offset + rows, w.rank_rows);
    layout.global_shape[0] = w.total;
    layout.offset[0] = w.row(offset);
  }
  DTensor y = make_output(dropout(moved.to_local(), p, seed, layout).y, x.mesh(), s.strategy.outputs[0], x.shape());
  record("dropout", s.inputs, std::span(&y, 1),
         [p, seed](const std::vector<DTensor>& g) { return std::vector<DTensor>{dropout(g[0], p, seed)}; });
  return y;
}

}  // namespace dtr
