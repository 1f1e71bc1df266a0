#include "optim/clip_grad.h"

#include <cmath>
#include <limits>
#include <map>

#include "collectives/process_group.h"
#include "core/error.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace dtr::optim {
namespace {

// Under --deterministic (kernels/block_reduce.h): a gradient's sum of squares with the same
// bits for any sharding. Each row (dim 0, which fully_shard and replicate never split) is
// summed in order in float64, the rows are gathered in global order and summed in
// block_reduce's tree.
double canonical_sum_of_squares(const DTensor& g) {
  for (const Placement& p : g.placements()) {
    DTR_CHECK(!p.splits_a_dim() || p.is_shard(0), NotImplementedError,
              "clip_grad_norm_ under --deterministic: the gradient {} is split along a dim other than 0 (tensor "
              "parallelism); the canonical norm sums whole rows",
              g.to_string());
  }
  const Tensor local = g.to_local().to(kCPU).to(kFloat64).contiguous();
  const int64_t rows = g.dim() == 0 ? 1 : local.size(0);
  const int64_t width = rows == 0 ? 0 : local.numel() / rows;
  Tensor sums = Tensor::empty({rows}, kFloat64);
  const double* x = local.data_ptr<double>();
  double* s = sums.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0.0;
    for (int64_t c = 0; c < width; ++c) acc += x[r * width + c] * x[r * width + c];
    s[r] = acc;
  }
  const DTensor row_sums(sums.to(g.to_local().device()),
                         DTensorSpec(g.mesh(), g.placements(), {g.dim() == 0 ? 1 : g.size(0)}, kFloat64));
  const Tensor all = row_sums.full_tensor().to(kCPU);
  return tree_sum(std::span(all.data_ptr<double>(), static_cast<size_t>(all.numel())));
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
      Placements reduced = g.placements();
      for (Placement& q : reduced) {
        if (q.is_partial()) q = Replicate();
      }
      g = g.redistribute(reduced);
      p->set_grad(g);
    }
    grads.push_back(g);
  }
  if (grads.empty()) return 0.0;
  double total = 0.0;
  if (deterministic_block_tokens() > 0 && !inf) {
    for (const DTensor& g : grads) total += canonical_sum_of_squares(g);
    return scale_to_norm(grads, std::sqrt(total), max_norm, error_if_nonfinite);
  }
  const DeviceMesh& mesh = grads.front().mesh();
  // Local sums of squares (or maxima), one bucket per set of mesh dims that shard a gradient.
  std::map<uint64_t, double> buckets;
  for (const DTensor& g : grads) {
    DTR_CHECK(g.mesh() == mesh, ValueError, "clip_grad_norm_: gradients live on different meshes ({} and {})",
              mesh.to_string(), g.mesh().to_string());
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
