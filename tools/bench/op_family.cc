#include "tools/bench/op_family.h"

#include <vector>

#include "optim/optimizer.h"

namespace dtr::bench {
namespace {

OpFamily family_of(const trace::Event& e) {
  if (e.category == optim::kOptimizerCategory) return OpFamily::kOptimizer;
  const std::string_view region = e.region, name = e.name;
  if (region == "attention") return OpFamily::kAttention;
  if (region == "norm" || name.starts_with("layer_norm")) return OpFamily::kNorms;
  if (name == "bmm" || name.starts_with("matmul")) return OpFamily::kMatmul;
  if (name.starts_with("embedding") || name.starts_with("cross_entropy")) return OpFamily::kEmbeddingAndLoss;
  return OpFamily::kElementwise;
}

bool counts(const trace::Event& e) {
  return e.category == trace::Category::kKernel || e.category == optim::kOptimizerCategory;
}

}  // namespace

std::string_view op_family_name(OpFamily f) {
  switch (f) {
    case OpFamily::kMatmul: return "matmul";
    case OpFamily::kAttention: return "attention";
    case OpFamily::kNorms: return "norms";
    case OpFamily::kElementwise: return "elementwise";
    case OpFamily::kEmbeddingAndLoss: return "embedding and loss";
    case OpFamily::kOptimizer: return "optimizer";
    case OpFamily::kOverhead: return "autograd and dispatch";
  }
  return "unknown";
}

FamilyTimes split_by_family(std::span<const trace::ThreadEvents> threads, double step_ms) {
  FamilyTimes ms{};
  double counted = 0;
  for (const trace::ThreadEvents& t : threads) {
    // inside[i]: event i is nested in a counted span (parents precede their children).
    std::vector<bool> inside(t.events.size(), false);
    for (size_t i = 0; i < t.events.size(); ++i) {
      const trace::Event& e = t.events[i];
      const bool in_counted = e.parent >= 0 && (inside[e.parent] || counts(t.events[e.parent]));
      inside[i] = in_counted;
      if (in_counted || !counts(e) || e.end_ns == 0) continue;
      const double span_ms = static_cast<double>(e.end_ns - e.begin_ns) / 1e6;
      ms[static_cast<size_t>(family_of(e))] += span_ms;
      counted += span_ms;
    }
  }
  ms[static_cast<size_t>(OpFamily::kOverhead)] = step_ms - counted;
  return ms;
}

}  // namespace dtr::bench
