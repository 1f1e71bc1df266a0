#include "tools/explain_sharding/execute_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/error.h"
#include "dtensor/device_mesh.h"
#include "dtensor/dtensor.h"
#include "dtensor/dtensor_spec.h"
#include "dtensor/redistribute_plan.h"

namespace dtr {
namespace {

// The global tensor as float64: integers in [-8, 8] following the flat index.
Tensor global_values(const Shape& shape) {
  Tensor t = Tensor::empty(shape, kFloat64);
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<double>((i * 7) % 17 - 8);
  return t;
}

// An integer in [-2, 2]: the random-looking part of group member k's term of element i on
// mesh dim m. Every member of the group computes it alike.
double noise(int64_t m, int64_t k, int64_t i) { return static_cast<double>((i + 3 * k + 5 * m) % 5 - 2); }

// This rank's local values under `spec` (float64): its chunk of `full`, then, for every
// Partial mesh dim in order, its term of that value. sum/avg: members k > 0 hold noise,
// member 0 the value (n times it for avg) minus their noise; max/min: member 0 holds the
// value, the others values on the losing side of it. Every member of a group along a
// Partial mesh dim starts from the same value: they agree on every other coordinate.
Tensor local_values(const Tensor& full, const DTensorSpec& spec) {
  Tensor value = ranges_of(full, spec.local_ranges()).clone();  // written below: a copy
  double* v = value.data_ptr<double>();
  const DeviceMesh& mesh = spec.mesh();
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = spec.placements()[m];
    if (!p.is_partial()) continue;
    const int64_t n = mesh.size(m), j = mesh.coordinate()[m];
    const ReduceOp op = p.reduce_op();
    for (int64_t i = 0; i < value.numel(); ++i) {
      if (is_linear(op)) {
        double others = 0;
        for (int64_t k = 1; k < n; ++k) others += noise(m, k, i);
        v[i] = j > 0 ? noise(m, j, i) : (op == ReduceOp::kAvg ? static_cast<double>(n) : 1.0) * v[i] - others;
      } else if (j > 0) {
        v[i] += (op == ReduceOp::kMax ? -1.0 : 1.0) * (1.0 + std::abs(noise(m, j, i)));
      }
    }
  }
  return value;
}

// Same shape and the same values, compared exactly in float64.
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const Tensor x = a.to(kFloat64).contiguous(), y = b.to(kFloat64).contiguous();
  return std::equal(x.data_ptr<double>(), x.data_ptr<double>() + x.numel(), y.data_ptr<double>());
}

// The collective of a step as the plan prints it: "all_gather", "reduce_scatter(sum)".
std::string collective_label(const RedistributeStep& step) {
  if (step.op == StepOp::kAllReduce || step.op == StepOp::kReduceScatter) {
    return fmt::format("{}({})", step_op_name(step.op), reduce_op_name(step.from.reduce_op()));
  }
  return std::string(step_op_name(step.op));
}

// The group of a step's mesh dims (flattened for a merged step) that holds `rank`.
std::vector<int64_t> group_of(const DeviceMesh& mesh, const RedistributeStep& step, int64_t rank) {
  for (std::vector<int64_t>& group : mesh.group_ranks(step.mesh_dim, step.num_mesh_dims)) {
    if (std::find(group.begin(), group.end(), rank) != group.end()) return group;
  }
  DTR_INTERNAL_ASSERT(false, "rank {} is in no group of mesh dims [{}, {}) of {}", rank, step.mesh_dim,
                      step.mesh_dim + step.num_mesh_dims, mesh.to_string());
}

// "1 (tp)" for one mesh dim, "0-1" for a merged step.
std::string mesh_dims_column(const DeviceMesh& mesh, const RedistributeStep& step) {
  if (step.num_mesh_dims == 1) return mesh.dim_label(step.mesh_dim);
  return fmt::format("{}-{}", step.mesh_dim, step.mesh_dim + step.num_mesh_dims - 1);
}

using CounterKey = std::pair<CollectiveKind, std::string>;

}  // namespace

bool execute_plan(const ExecuteRequest& request, std::ostream& out) {
  const DeviceMesh laid_out = init_device_mesh(kCPU, request.mesh_shape, request.mesh_dim_names);
  const DeviceMesh mesh = request.view.empty() ? laid_out : laid_out.submesh(request.view);
  const DTensorSpec source(mesh, request.from, request.shape, request.dtype);
  const RedistributePlan plan = plan_redistribute(source, request.to);
  const DTensorSpec target = source.with_placements(plan.target_placements());
  const Tensor full = global_values(request.shape);
  const DTensor x = from_local(local_values(full, source).to(request.dtype), mesh, request.from, request.shape);

  collective_counter().reset();
  const DTensor y = x.redistribute(plan.target_placements());
  const Tensor& local = y.to_local();
  const std::vector<CollectiveCount> measured = collective_counter().snapshot();

  // The collective steps (numbered as the plan prints them) and the counter entry of each.
  std::vector<size_t> step_numbers;
  std::vector<CounterKey> keys;
  for (size_t k = 0; k < plan.steps().size(); ++k) {
    const RedistributeStep& s = plan.steps()[k];
    if (!is_collective(s.op)) continue;
    step_numbers.push_back(k + 1);
    keys.emplace_back(collective_kind(s.op), mesh.flattened_group(s.mesh_dim, s.num_mesh_dims).name());
  }
  const int64_t collectives = static_cast<int64_t>(keys.size());

  // This rank's row of the report: [calls, bytes] per collective step, then the unplanned
  // calls and bytes, then the two checks (1 = passed).
  std::vector<int64_t> row;
  for (const CounterKey& key : keys) {
    const auto it = std::find_if(measured.begin(), measured.end(), [&](const CollectiveCount& c) {
      return c.kind == key.first && c.group == key.second;
    });
    row.push_back(it == measured.end() ? 0 : it->calls);
    row.push_back(it == measured.end() ? 0 : it->bytes);
  }
  int64_t unplanned_calls = 0, unplanned_bytes = 0;
  for (const CollectiveCount& c : measured) {
    if (std::find(keys.begin(), keys.end(), CounterKey{c.kind, c.group}) != keys.end()) continue;
    unplanned_calls += c.calls;
    unplanned_bytes += c.bytes;
    fmt::print(stderr, "unplanned collective: {} on group '{}': {} call(s), {} B\n", collective_kind_name(c.kind),
               c.group, c.calls, c.bytes);
  }
  const bool local_ok = y.placements() == plan.target_placements() && local.shape() == target.local_shape() &&
                        (target.has_partial() || same_values(local, ranges_of(full, target.local_ranges())));
  const bool full_ok = same_values(y.full_tensor(), full);
  row.insert(row.end(), {unplanned_calls, unplanned_bytes, local_ok ? 1 : 0, full_ok ? 1 : 0});

  // Every rank gets every rank's row, so every rank reaches the same verdict.
  ProcessGroup& world = *default_group();
  const int64_t width = static_cast<int64_t>(row.size());
  const Tensor mine = Tensor::from_vector(row, {width});
  Tensor all = Tensor::empty({world.size(), width}, kInt64);
  world.all_gather_into_tensor(all, mine).wait();
  auto at = [&](int64_t rank, int64_t column) { return all.data_ptr<int64_t>()[rank * width + column]; };

  // One line per collective step and rank. The counter sums calls of one kind on one
  // group, so the plan's side sums the steps with the same key.
  auto group_label = [&](int64_t i, int64_t rank) {
    return fmt::format("{}", group_of(mesh, plan.steps()[step_numbers[i] - 1], rank));
  };
  size_t group_width = 5;
  for (int64_t i = 0; i < collectives; ++i) {
    for (int64_t rank : mesh.ranks()) group_width = std::max(group_width, group_label(i, rank).size());
  }
  std::vector<std::string> lines;
  int64_t mismatches = 0;
  for (int64_t i = 0; i < collectives; ++i) {
    const RedistributeStep& s = plan.steps()[step_numbers[i] - 1];
    for (int64_t k = 0; k < mesh.size(); ++k) {
      const int64_t rank = mesh.ranks()[k];
      int64_t planned_calls = 0, planned_bytes = 0;
      for (int64_t q = 0; q < collectives; ++q) {
        if (keys[q] != keys[i]) continue;
        planned_calls += 1;
        planned_bytes += plan.steps()[step_numbers[q] - 1].buffer_bytes[k];
      }
      const int64_t calls = at(rank, 2 * i), bytes = at(rank, 2 * i + 1);
      const bool ok = calls == planned_calls && bytes == planned_bytes;
      mismatches += ok ? 0 : 1;
      lines.push_back(fmt::format("{:>4} | {:<8} | {:<19} | {:>4} | {:<{}} | {:>17} | {:>14} | {:>14} | {}",
                                  step_numbers[i], mesh_dims_column(mesh, s), collective_label(s), rank,
                                  group_label(i, rank), group_width,
                                  fmt::format("{}/{}", s.send_bytes[k], s.recv_bytes[k]),
                                  fmt::format("{} x {} B", planned_calls, planned_bytes),
                                  fmt::format("{} x {} B", calls, bytes), ok ? "ok" : "MISMATCH"));
    }
  }
  const int64_t tail = 2 * collectives;
  std::vector<int64_t> unplanned_ranks, local_failed, full_failed;
  for (int64_t rank = 0; rank < world.size(); ++rank) {
    if (at(rank, tail) != 0) unplanned_ranks.push_back(rank);
    if (at(rank, tail + 2) != 1) local_failed.push_back(rank);
    if (at(rank, tail + 3) != 1) full_failed.push_back(rank);
  }
  const bool passed = mismatches == 0 && unplanned_ranks.empty() && local_failed.empty() && full_failed.empty();
  if (world.rank() != 0) return passed;

  out << fmt::format(
      "executed on {} ranks; measured: the CollectiveCounter's calls x nccl-tests size (a call's "
      "larger buffer: all_gather's output, reduce_scatter's input, all_reduce's tensor)\n",
      world.size());
  if (lines.empty()) {
    out << "no collective steps planned\n";
  } else {
    out << fmt::format("{:>4} | {:<8} | {:<19} | {:>4} | {:<{}} | {:>17} | {:>14} | {:>14} |\n", "step", "mesh dim",
                       "collective", "rank", "group", group_width, "planned send/recv", "planned", "measured");
    for (const std::string& line : lines) out << line << "\n";
  }
  auto verdict = [](const std::vector<int64_t>& failed) {
    return failed.empty() ? std::string("ok") : fmt::format("FAILED on ranks {}", failed);
  };
  std::string unplanned = "none";
  if (!unplanned_ranks.empty()) {
    unplanned.clear();
    for (int64_t rank : unplanned_ranks) {
      unplanned += fmt::format("rank {}: {} call(s), {} B; ", rank, at(rank, tail), at(rank, tail + 1));
    }
    unplanned += "MISMATCH";
  }
  out << "unplanned collectives: " << unplanned << "\n"
      << "check: full_tensor() equals the global tensor: " << verdict(full_failed) << "\n"
      << (target.has_partial() ? "check: local shape equals the rank's target chunk (values not compared: the target "
                                 "is Partial, each rank holds a term): "
                               : "check: local tensor equals the rank's target chunk: ")
      << verdict(local_failed) << "\n"
      << (passed ? std::string("execute: ok")
                 : fmt::format("execute: FAILED ({} mismatching row(s){})", mismatches,
                               unplanned_ranks.empty() ? "" : ", unplanned collectives"))
      << std::endl;
  return passed;
}

}  // namespace dtr
