#include "optim/clip_grad.h"

#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <span>

#include "collectives/process_group.h"
#include "core/error.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "kernels/shape_ops.h"

namespace dtr::optim {
namespace {

// The units a gradient's squares are summed in under --deterministic, per row of dim 0: the
// whole row, or with feature blocks (kernels/block_reduce.h) that many blocks of dim 1, which
// tensor parallelism splits (a row-parallel weight's [out, in] along in). Fixed by the shape.
int64_t units_per_row(const DTensor& g) {
  const int64_t blocks = deterministic_feature_blocks();
  return g.dim() >= 2 && blocks > 1 && g.size(1) % blocks == 0 ? blocks : 1;
}

// A gradient's local units' sums of squares, [rows, units] (rows of dim 0, `units` blocks of
// dim 1 across the whole gradient; each summed in order in float64; a 0-d gradient is one
// row), on the CPU.
Tensor unit_sums(const DTensor& g, int64_t units) {
  Tensor local = g.to_local().to(kCPU).contiguous();
  if (local.dtype() != kFloat32) local = local.to(kFloat64);  // float32 is read as it is
  const int64_t rows = g.dim() == 0 ? 1 : local.size(0);
  const int64_t width = rows == 0 ? 0 : local.numel() / rows;
  // This rank's units of a row: its share of dim 1 over the unit's columns.
  const int64_t unit_columns = g.dim() >= 2 ? g.size(1) / units : 1;
  DTR_CHECK(units == 1 || local.size(1) % unit_columns == 0, ValueError,
            "clip_grad_norm_ under --deterministic: the gradient {} holds {} of dim 1's {} columns on this rank, not "
            "whole blocks of {} (--feature-blocks {}); split dim 1 into whole blocks",
            g.to_string(), local.size(1), g.size(1), unit_columns, units);
  const int64_t held = units == 1 ? 1 : local.size(1) / unit_columns;
  const int64_t unit_width = held == 0 ? 0 : width / held;
  Tensor sums = Tensor::empty({rows, held}, kFloat64);
  double* s = sums.data_ptr<double>();
  auto sum_units = [&](const auto* x) {
    for (int64_t u = 0; u < rows * held; ++u) {
      double acc = 0.0;
      for (int64_t c = 0; c < unit_width; ++c) {
        const double v = x[u * unit_width + c];
        acc += v * v;
      }
      s[u] = acc;
    }
  };
  if (local.dtype() == kFloat32) {
    sum_units(local.data_ptr<float>());
  } else {
    sum_units(local.data_ptr<double>());
  }
  return sums;
}

// The rows of `g` that the rank at `coordinate` holds.
int64_t rows_at(const DTensor& g, std::span<const int64_t> coordinate) {
  return g.dim() == 0 ? 1 : g.spec().local_shape(coordinate)[0];
}

// Under --deterministic (kernels/block_reduce.h): the gradients' sum of squares with the
// same bits for any sharding. Each gradient's units (rows of dim 0, or with feature blocks
// blocks of each row: units_per_row) are summed in order, the units' sums gathered in global
// order (the gradients split on dim 0 of one mesh dim, fully_shard's, all in one
// all_gather_v over it; others through full_tensor) and summed in block_reduce's tree; the
// gradients' sums add in their order. The gradients share one mesh.
double canonical_sum_of_squares(const std::vector<DTensor>& grads) {
  const DeviceMesh& mesh = grads.front().mesh();
  std::vector<Tensor> rows(grads.size());           // each gradient's unit sums, flattened in global order at the end
  std::map<int64_t, std::vector<size_t>> split_on;  // mesh dim -> the gradients split on its dim 0 alone
  for (size_t i = 0; i < grads.size(); ++i) {
    const DTensor& g = grads[i];
    const int64_t units = units_per_row(g);
    std::vector<int64_t> splitting;
    bool rows_only = true;  // every split is a plain Shard(0)
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      const Placement& p = g.placements()[m];
      const bool whole_units = p.splits_dim(0) || (p.is_shard(1) && units > 1);
      DTR_CHECK(!p.splits_a_dim() || whole_units, NotImplementedError,
                "clip_grad_norm_ under --deterministic: the gradient {} is split along a dim the canonical norm's "
                "units do not follow; it sums rows of dim 0, or with feature blocks ({} now) blocks of dim 1 when "
                "they divide it",
                g.to_string(), deterministic_feature_blocks());
      if (p.splits_a_dim() && mesh.size(m) > 1) {
        splitting.push_back(m);
        rows_only = rows_only && p.is_shard(0);
      }
    }
    rows[i] = unit_sums(g, units);
    if (splitting.size() == 1 && rows_only) {
      split_on[splitting[0]].push_back(i);
    } else if (!splitting.empty()) {
      rows[i] = DTensor(rows[i].to(g.to_local().device()),
                        DTensorSpec(mesh, g.placements(), {g.dim() == 0 ? 1 : g.size(0), units}, kFloat64))
                    .full_tensor()
                    .to(kCPU);
    }
    rows[i] = rows[i].reshape({rows[i].numel()});
  }
  for (const auto& [m, members] : split_on) {
    ProcessGroup& group = mesh.group(m);
    std::vector<int64_t> coordinate = mesh.coordinate();
    // held[r][k]: the units member k's gradient has on the rank at coordinate r of dim m.
    std::vector<std::vector<int64_t>> held(static_cast<size_t>(group.size()));
    std::vector<int64_t> counts;
    for (int64_t r = 0; r < group.size(); ++r) {
      coordinate[static_cast<size_t>(m)] = r;
      int64_t total = 0;
      for (size_t k : members) {
        total += held[static_cast<size_t>(r)].emplace_back(rows_at(grads[k], coordinate) * units_per_row(grads[k]));
      }
      counts.push_back(total);
    }
    std::vector<Tensor> mine;
    for (size_t k : members) mine.push_back(rows[k]);
    const Tensor local = cat(mine).to(group.device());
    Tensor all = Tensor::empty({std::accumulate(counts.begin(), counts.end(), int64_t{0})}, kFloat64, group.device());
    group.all_gather_v(all, local, counts).wait();
    all = all.to(kCPU);
    int64_t offset = 0;
    std::vector<std::vector<Tensor>> pieces(members.size());
    for (int64_t r = 0; r < group.size(); ++r) {
      for (size_t k = 0; k < members.size(); ++k) {
        const int64_t n = held[static_cast<size_t>(r)][k];
        pieces[k].push_back(all.narrow(0, offset, n));
        offset += n;
      }
    }
    for (size_t k = 0; k < members.size(); ++k) rows[members[k]] = cat(pieces[k]).contiguous();
  }
  double total = 0.0;
  for (const Tensor& r : rows) {
    total += tree_sum(std::span(r.data_ptr<double>(), static_cast<size_t>(r.numel())));
  }
  return total;
}

// Checks the norm (ValueError when non-finite, unless kNo) and scales every gradient by
// max_norm / (norm + 1e-6) when that is below 1. Returns the norm.
double scale_to_norm(const std::vector<DTensor>& grads, double total, double max_norm,
                     ErrorIfNonfinite error_if_nonfinite) {
  DTR_CHECK(std::isfinite(total) || error_if_nonfinite == ErrorIfNonfinite::kNo, ValueError,
            "clip_grad_norm_: the total norm of the gradients is {}; the gradients hold inf or nan "
            "(ErrorIfNonfinite::kNo clips anyway)",
            total);
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1.0) {
    for (const DTensor& g : grads) {
      Tensor local = g.to_local();  // a handle: scales the gradient's storage
      mul_(local, coefficient);
    }
  }
  return total;
}

}  // namespace

double clip_grad_norm_(const std::vector<DTensor*>& parameters, double max_norm, double norm_type,
                       ErrorIfNonfinite error_if_nonfinite) {
  const bool inf = std::isinf(norm_type);
  DTR_CHECK(norm_type == 2.0 || (inf && norm_type > 0), ValueError,
            "clip_grad_norm_: norm_type {} is not supported; use 2 or infinity", norm_type);
  DTR_CHECK(max_norm >= 0, ValueError, "clip_grad_norm_: max_norm {} must be non-negative", max_norm);
  std::vector<DTensor> grads;
  for (DTensor* p : parameters) {
    if (p == nullptr || !p->grad().defined()) continue;
    DTensor g = p->grad();
    if (g.spec().has_partial()) {  // a Partial gradient's value is its reduction
      g = g.redistribute(reduced_placements(g.placements()));
      p->set_grad(g);
    }
    grads.push_back(g);
  }
  if (grads.empty()) return 0.0;
  const DeviceMesh& mesh = grads.front().mesh();
  for (const DTensor& g : grads) {
    DTR_CHECK(g.mesh() == mesh, ValueError, "clip_grad_norm_: gradients live on different meshes ({} and {})",
              mesh.to_string(), g.mesh().to_string());
  }
  if (deterministic_block_tokens() > 0 && !inf) {
    return scale_to_norm(grads, std::sqrt(canonical_sum_of_squares(grads)), max_norm, error_if_nonfinite);
  }
  // Local sums of squares (or maxima), one bucket per set of mesh dims that shard a gradient.
  std::map<uint64_t, double> buckets;
  for (const DTensor& g : grads) {
    uint64_t sharded = 0;
    for (int64_t m = 0; m < mesh.ndim(); ++m) {
      if (g.placements()[m].splits_a_dim() && mesh.size(m) > 1) sharded |= uint64_t{1} << m;
    }
    const Tensor& local = g.to_local();
    double part = 0.0;
    if (local.numel() > 0) {
      part = inf ? max(abs(local.to(kFloat64))).item() : sum_of_squares(local.to(kFloat64)).item();
    }
    double& b = buckets[sharded];
    b = inf ? std::max(b, part) : b + part;
  }
  // One all_reduce per mesh dim, over the buckets of every gradient sharded on it.
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    std::vector<double*> values;
    for (auto& [sharded, v] : buckets) {
      if (sharded >> m & 1) values.push_back(&v);
    }
    if (values.empty()) continue;
    Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, kFloat64);
    for (size_t i = 0; i < values.size(); ++i) t.data_ptr<double>()[i] = *values[i];
    ProcessGroup& group = mesh.group(m);
    Tensor on_group = t.to(group.device());  // NCCL moves CUDA tensors only
    group.all_reduce(on_group, inf ? ReduceOp::kMax : ReduceOp::kSum).wait();
    t = on_group.to(kCPU);
    for (size_t i = 0; i < values.size(); ++i) *values[i] = t.data_ptr<double>()[i];
  }
  double total = 0.0;
  for (const auto& [sharded, v] : buckets) total = inf ? std::max(total, v) : total + v;
  if (!inf) total = std::sqrt(total);
  return scale_to_norm(grads, total, max_norm, error_if_nonfinite);
}

void clip_grad_value_(const std::vector<DTensor*>& parameters, double clip_value) {
  DTR_CHECK(clip_value >= 0, ValueError, "clip_grad_value_: clip_value {} must be non-negative", clip_value);
  for (DTensor* p : parameters) {
    if (p == nullptr || !p->grad().defined()) continue;
    Tensor local = p->grad().to_local();
    local.copy_(clamp(local, -clip_value, clip_value));
  }
}

}  // namespace dtr::optim
