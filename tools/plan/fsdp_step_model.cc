#include "tools/plan/fsdp_step_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "tools/train/mfu.h"

namespace dtr::bench {

StepPlan plan_fsdp_step(const PlanModel& m, const PlanCluster& c, const CostModel& nccl) {
  DTR_CHECK(m.layers > 0 && m.dim > 0 && m.vocab > 0 && m.seq_len > 0 && m.batch_per_gpu > 0, ValueError,
            "plan_fsdp_step: layers {}, dim {}, vocab {}, seq_len {}, batch_per_gpu {}: every size must be positive",
            m.layers, m.dim, m.vocab, m.seq_len, m.batch_per_gpu);
  DTR_CHECK(c.gpus >= 1 && c.peak_tflops > 0 && c.hbm_bytes_per_s > 0 && c.compute_efficiency > 0 &&
                c.compute_efficiency <= 1,
            ValueError,
            "plan_fsdp_step: gpus {}, peak {} TFLOP/s, HBM {} B/s, compute efficiency {}: gpus >= 1, the rest "
            "positive, the efficiency at most 1",
            c.gpus, c.peak_tflops, c.hbm_bytes_per_s, c.compute_efficiency);
  const double d = static_cast<double>(m.dim), tokens = static_cast<double>(m.batch_per_gpu * m.seq_len);
  const int64_t block_params = 12 * m.dim * m.dim + 13 * m.dim;
  const int64_t root_params = (m.vocab + m.seq_len) * m.dim + 2 * m.dim;  // tied output, positions, final norm
  const double flop_s = c.peak_tflops * 1e12 * c.compute_efficiency;

  auto time_of = [&](CollectiveKind kind, int64_t bytes) {
    const std::optional<double> t = nccl.predict_seconds(kind, c.gpus, bytes);
    DTR_CHECK(t.has_value(), ValueError, "plan_fsdp_step: the cost model ({}, {}) has no {} fit", nccl.machine(),
              nccl.backend(), collective_kind_name(kind));
    return *t;
  };
  const double block_ag = time_of(CollectiveKind::kAllGather, 2 * block_params);
  const double block_rs = time_of(CollectiveKind::kReduceScatter, 4 * block_params);
  const double root_ag = time_of(CollectiveKind::kAllGather, 2 * root_params);
  const double root_rs = time_of(CollectiveKind::kReduceScatter, 4 * root_params);

  const double block_fwd =
      (2 * static_cast<double>(block_params) * tokens + 4 * static_cast<double>(m.seq_len) * d * tokens) / flop_s;
  const double block_bwd = 2 * block_fwd;
  const double output_fwd = 2 * static_cast<double>(m.vocab) * d * tokens / flop_s;  // the tied projection
  const double output_bwd = 2 * output_fwd;
  const double embed_fwd = 0;  // a gather of rows: no FLOPs to hide behind

  auto exposed = [](double comm, double compute) { return std::max(0.0, comm - compute); };
  double exposed_total = 0;
  exposed_total += root_ag;                       // the step's first collective: nothing runs before it
  exposed_total += exposed(block_ag, embed_fwd);  // block 0's, behind the embedding
  for (int64_t i = 0; i + 1 < m.layers; ++i) exposed_total += exposed(block_ag, block_fwd);
  exposed_total += exposed(block_ag, output_bwd);  // block L-1's backward all-gather
  for (int64_t i = m.layers - 1; i >= 0; --i) {
    const double comm = (i > 0 ? block_ag : 0) + (i + 1 < m.layers ? block_rs : 0);
    exposed_total += exposed(comm, block_bwd);
  }
  exposed_total += block_rs + root_rs;  // after the last compute

  StepPlan p;
  p.parameters = m.layers * block_params + root_params;
  p.all_gather_bytes = 2 * (2 * m.layers * block_params) + 2 * root_params;
  p.reduce_scatter_bytes = 4 * (m.layers * block_params + root_params);
  p.compute_s = static_cast<double>(m.layers) * (block_fwd + block_bwd) + output_fwd + output_bwd;
  p.all_gather_s = 2 * static_cast<double>(m.layers) * block_ag + root_ag;
  p.reduce_scatter_s = static_cast<double>(m.layers) * block_rs + root_rs;
  p.exposed_s = exposed_total;
  p.optimizer_s = 28.0 * static_cast<double>(p.parameters) / static_cast<double>(c.gpus) / c.hbm_bytes_per_s;
  p.step_s = p.compute_s + p.exposed_s + p.optimizer_s;
  p.tokens_per_s_per_gpu = tokens / p.step_s;
  p.mfu = train::mfu(p.tokens_per_s_per_gpu, train::model_flops_per_token(p.parameters, m.layers, m.dim, m.seq_len),
                     c.peak_tflops);
  return p;
}

}  // namespace dtr::bench
