#include "optim/clip_grad.h"

#include <cmath>
#include <limits>
#include <map>

#include "collectives/process_group.h"
#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace dtr::optim {

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
  double total = 0.0;
  for (const auto& [sharded, v] : buckets) total = inf ? std::max(total, v) : total + v;
  if (!inf) total = std::sqrt(total);
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

void clip_grad_value_(const std::vector<DTensor*>& parameters, double clip_value) {
  DTR_CHECK(clip_value >= 0, ValueError, "clip_grad_value_: clip_value {} must be non-negative", clip_value);
  for (DTensor* p : parameters) {
    if (p == nullptr || !p->grad().defined()) continue;
    Tensor local = p->grad().to_local();
    local.copy_(clamp(local, -clip_value, clip_value));
  }
}

}  // namespace dtr::optim
