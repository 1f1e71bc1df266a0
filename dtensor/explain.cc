#include "dtensor/explain.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <span>
#include <string_view>

#include "collectives/reduce_op.h"
#include "core/units.h"
#include "dtensor/internal/text_table.h"

namespace dtr {
namespace {

// "mesh dim 1 (tp)", or "mesh dims 0-1 (dp, tp)" for a merged step.
std::string mesh_dims_label(const DeviceMesh& mesh, int64_t first, int64_t count) {
  if (count == 1) return "mesh dim " + mesh.dim_label(first);
  std::string label = fmt::format("mesh dims {}-{}", first, first + count - 1);
  if (mesh.dim_names().empty()) return label;
  const auto names = std::span(mesh.dim_names()).subspan(first, count);
  return fmt::format("{} ({})", label, fmt::join(names, ", "));
}

// A collective step's buffer on its busiest rank, and the time cost_model predicts for it
// (std::nullopt when the model has no fit for its kind).
struct StepCost {
  int64_t buffer_bytes;
  std::optional<double> seconds;
};

StepCost step_cost(const DeviceMesh& m, const RedistributeStep& s, const CostModel& cost_model) {
  const int64_t bytes = *std::max_element(s.buffer_bytes.begin(), s.buffer_bytes.end());
  const int64_t group_size = static_cast<int64_t>(m.group_ranks(s.mesh_dim, s.num_mesh_dims).front().size());
  return {bytes, cost_model.predict_seconds(collective_kind(s.op), group_size, bytes)};
}

// What train --deterministic (kernels/block_reduce.h) makes of a sum step: over more than two
// ranks it runs in the canonical tree of the group's members (dtensor/redistribute.cc), not
// in the ring's order; over two the ring's one addition is the tree's. "" for other steps.
std::string deterministic_note(const DeviceMesh& m, const RedistributeStep& s, const CostModel* cost_model) {
  if (!sums_partial(s)) return "";
  if (m.group_ranks(s.mesh_dim, s.num_mesh_dims).front().size() <= 2) {
    return "; deterministic: as planned (two ranks: one addition, the canonical tree's)";
  }
  return fmt::format(
      "; deterministic: in the canonical tree of the group's members instead: an all_to_all of their blocks, each "
      "rank summing the blocks of its part in the tree{}, the ring's bytes per rank{}",
      s.op == StepOp::kAllReduce ? ", then an all_gather of the parts" : "",
      cost_model != nullptr ? " (the predicted time is the ring's)" : "");
}

// One line per step: its mesh dims, placements, op and groups; with a cost model, a
// collective's buffer bytes and predicted time; with Deterministic::kYes, how a sum runs.
std::string step_lines(const DeviceMesh& m, const std::vector<RedistributeStep>& steps, std::string_view indent,
                       const CostModel* cost_model, Deterministic deterministic) {
  std::string out;
  for (size_t k = 0; k < steps.size(); ++k) {
    const RedistributeStep& s = steps[k];
    const std::string groups = fmt::format("{}", m.group_ranks(s.mesh_dim, s.num_mesh_dims));
    std::string what;
    switch (s.op) {
      case StepOp::kAllGather:
      case StepOp::kAllToAll: what = fmt::format("{} over groups {}", step_op_name(s.op), groups); break;
      case StepOp::kAllReduce:
      case StepOp::kReduceScatter:
        what = fmt::format("{}({}) over groups {}", step_op_name(s.op), reduce_op_name(s.from.reduce_op()), groups);
        break;
      case StepOp::kChunk: what = "chunk (local: each rank keeps its chunk)"; break;
      case StepOp::kPad:
        what = fmt::format("pad (local: each rank's shard at its offset, {} elsewhere)",
                           s.to.reduce_op() == ReduceOp::kSum   ? "zeros"
                           : s.to.reduce_op() == ReduceOp::kMax ? "the lowest value"
                                                                : "the highest value");
        break;
      case StepOp::kPartition: what = "partition (local: coordinate 0 keeps the value, the others hold zeros)"; break;
      case StepOp::kRelabel: what = "relabel (no data changes)"; break;
    }
    if (s.num_mesh_dims > 1) {
      what += fmt::format(" (merged: one collective over the {} mesh dims flattened, instead of {})", s.num_mesh_dims,
                          s.num_mesh_dims);
    }
    if (cost_model != nullptr && is_collective(s.op)) {
      const StepCost cost = step_cost(m, s, *cost_model);
      what += cost.seconds ? fmt::format(": {} B per rank ~{}", cost.buffer_bytes, format_seconds(*cost.seconds))
                           : fmt::format(": {} B per rank, no {} fit in the cost model", cost.buffer_bytes,
                                         collective_kind_name(collective_kind(s.op)));
    }
    if (deterministic == Deterministic::kYes) what += deterministic_note(m, s, cost_model);
    out += fmt::format("{}step {}: {}: {} -> {}, {}\n", indent, k + 1, mesh_dims_label(m, s.mesh_dim, s.num_mesh_dims),
                       s.from, s.to, what);
  }
  return out;
}

// The plan's predicted time: the sum over its collective steps (they run one after another).
std::string predicted_total(const DeviceMesh& m, const std::vector<RedistributeStep>& steps,
                            const CostModel& cost_model) {
  double seconds = 0;
  int64_t unknown = 0;
  for (const RedistributeStep& s : steps) {
    if (!is_collective(s.op)) continue;
    const std::optional<double> step = step_cost(m, s, cost_model).seconds;
    seconds += step.value_or(0);
    unknown += !step.has_value();
  }
  return fmt::format("predicted time: ~{}{} (cost model: {}, {})\n", format_seconds(seconds),
                     unknown == 0 ? "" : fmt::format(", leaving out {} step(s) with no fit", unknown),
                     cost_model.machine(), cost_model.backend());
}

}  // namespace

std::string explain_plan(const RedistributePlan& plan, const CostModel* cost_model, Deterministic deterministic) {
  const DeviceMesh& m = plan.mesh();
  const std::vector<DTensorSpec>& sources = plan.sources();
  const std::vector<RedistributeStep>& steps = plan.steps();
  std::vector<std::string> tensors;
  for (const DTensorSpec& s : sources) tensors.push_back(fmt::format("{}{}", s.dtype(), s.shape()));
  std::string out =
      fmt::format("redistribute {}{}: {} -> {} on {}\n",
                  sources.size() == 1 ? "" : fmt::format("{} tensors ", sources.size()), fmt::join(tensors, ", "),
                  placements_str(plan.source_placements()), placements_str(plan.target_placements()), m.to_string());
  if (steps.empty()) return out + "no steps: the placements already match\n";
  const int64_t collectives = plan.num_collectives();
  out += fmt::format("{} step{}, {} collective{}:\n", steps.size(), steps.size() == 1 ? "" : "s", collectives,
                     collectives == 1 ? "" : "s");
  out += step_lines(m, steps, "  ", cost_model, deterministic);
  if (collectives == 0) return out + "no communication\n";
  if (cost_model != nullptr) out += predicted_total(m, steps, *cost_model);
  out += "bytes per rank (chunks padded to ceil(size/n), so every rank of a group sends equal buffers):\n";
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"rank", "coord"};
  for (size_t k = 0; k < steps.size(); ++k) {
    if (is_collective(steps[k].op)) header.push_back(fmt::format("step {} send/recv", k + 1));
  }
  header.insert(header.end(), {"total send", "total recv"});
  rows.push_back(std::move(header));
  const std::vector<int64_t> send = plan.total_send_bytes(), recv = plan.total_recv_bytes();
  for (int64_t r = 0; r < m.size(); ++r) {
    std::vector<std::string> row = {fmt::format("{}", m.ranks()[r]),
                                    fmt::format("({})", fmt::join(m.coordinate_at(r), ", "))};
    for (const RedistributeStep& s : steps) {
      if (is_collective(s.op)) row.push_back(fmt::format("{}/{}", s.send_bytes[r], s.recv_bytes[r]));
    }
    row.insert(row.end(), {fmt::format("{}", send[r]), fmt::format("{}", recv[r])});
    rows.push_back(std::move(row));
  }
  return out + internal::format_table(rows);
}

std::string explain_alternatives(const std::vector<RedistributePlan>& alternatives, const CostModel* cost_model) {
  const size_t best = best_plan_index(alternatives);
  const RedistributePlan& chosen = alternatives[best];
  const DeviceMesh& m = chosen.mesh();
  std::string out = fmt::format("{} plan{} considered for {} -> {} on {}:\n", alternatives.size(),
                                alternatives.size() == 1 ? "" : "s", chosen.sources().front().to_string(),
                                placements_str(chosen.target_placements()), m.to_string());
  for (size_t k = 0; k < alternatives.size(); ++k) {
    const RedistributePlan& p = alternatives[k];
    const auto [max_send, total_send, collectives, steps] = plan_cost(p);
    out += fmt::format("plan {}{}: {}: {} step{}, {} collective{}, bytes sent: {} on the busiest rank, {} in all\n",
                       k + 1, k == best ? " (chosen)" : "", p.strategy(), steps, steps == 1 ? "" : "s", collectives,
                       collectives == 1 ? "" : "s", max_send, total_send);
    out += step_lines(m, p.steps(), "  ", cost_model, Deterministic::kNo);
    if (cost_model != nullptr && collectives > 0) out += "  " + predicted_total(m, p.steps(), *cost_model);
  }
  if (alternatives.size() == 1) return out + "chosen: plan 1, the only one\n";
  // Why: the first key of the ranking on which the chosen plan beats the runner-up.
  size_t runner_up = best == 0 ? 1 : 0;
  for (size_t k = 0; k < alternatives.size(); ++k) {
    if (k != best && plan_cost(alternatives[k]) < plan_cost(alternatives[runner_up])) runner_up = k;
  }
  const auto a = plan_cost(chosen), b = plan_cost(alternatives[runner_up]);
  std::string why;
  if (a.max_send_bytes != b.max_send_bytes) {
    why = fmt::format("the fewest bytes sent by the busiest rank ({} against {})", a.max_send_bytes, b.max_send_bytes);
  } else if (a.total_send_bytes != b.total_send_bytes) {
    why = fmt::format("as few bytes on the busiest rank as plan {}, and the fewest in all ({} against {})",
                      runner_up + 1, a.total_send_bytes, b.total_send_bytes);
  } else if (a.num_collectives != b.num_collectives) {
    why = fmt::format("the same bytes as plan {}, and fewer collectives ({} against {})", runner_up + 1,
                      a.num_collectives, b.num_collectives);
  } else if (a.num_steps != b.num_steps) {
    why = fmt::format("the same bytes and collectives as plan {}, and fewer steps ({} against {})", runner_up + 1,
                      a.num_steps, b.num_steps);
  } else {
    why = fmt::format("it ties with plan {} and comes first", runner_up + 1);
  }
  return out + fmt::format("chosen: plan {}: {}\n", best + 1, why);
}

}  // namespace dtr
