#include "dtensor/redistribute_plan.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "dtensor/chunking.h"
#include "dtensor/internal/text_table.h"
#include "kernels/error.h"

namespace dtr {

std::string_view step_op_name(StepOp op) {
  switch (op) {
    case StepOp::kAllGather: return "all_gather";
    case StepOp::kAllToAll: return "all_to_all";
    case StepOp::kAllReduce: return "all_reduce";
    case StepOp::kReduceScatter: return "reduce_scatter";
    case StepOp::kChunk: return "chunk";
    case StepOp::kPartition: return "partition";
    case StepOp::kRelabel: return "relabel";
  }
  return "?";
}

bool is_collective(StepOp op) {
  return op == StepOp::kAllGather || op == StepOp::kAllToAll || op == StepOp::kAllReduce ||
         op == StepOp::kReduceScatter;
}

namespace {

// The op that moves one mesh dim of size mesh_size from `from` to `to` (from != to,
// and never Shard -> Partial: the planner goes through Replicate).
StepOp step_op(const Placement& from, const Placement& to, int64_t mesh_size) {
  if (mesh_size == 1) return StepOp::kRelabel;
  if (from.is_shard()) return to.is_replicate() ? StepOp::kAllGather : StepOp::kAllToAll;
  if (from.is_partial()) return to.is_replicate() ? StepOp::kAllReduce : StepOp::kReduceScatter;
  if (to.is_shard()) return StepOp::kChunk;
  return to.reduce_op() == ReduceOp::kSum ? StepOp::kPartition : StepOp::kRelabel;
}

// The mesh dims before `mesh_dim` that shard tensor dim `dim`.
std::vector<int64_t> sharders_before(const Placements& placements, int64_t mesh_dim, int64_t dim) {
  std::vector<int64_t> dims;
  for (int64_t j = 0; j < mesh_dim; ++j) {
    if (placements[j].is_shard(dim)) dims.push_back(j);
  }
  return dims;
}

// The nesting rule: mesh dim i may drop or add Shard(d) only when no later mesh dim
// shards d (its chunks would otherwise be chunks of the wrong piece).
bool nesting_allows(const Placements& current, int64_t mesh_dim, const Placement& to) {
  for (const Placement& p : {current[mesh_dim], to}) {
    if (!p.is_shard()) continue;
    for (size_t j = mesh_dim + 1; j < current.size(); ++j) {
      if (current[j].is_shard(p.shard_dim())) return false;
    }
  }
  return true;
}

// PyTorch's greedy order (docs/redistribute_planner.md). Bytes are left at zero.
std::vector<RedistributeStep> plan_steps(const DeviceMesh& mesh, const Placements& source, const Placements& target) {
  std::vector<RedistributeStep> steps;
  Placements current = source;
  const int64_t m = mesh.ndim();
  auto emit = [&](int64_t i, const Placement& to) {
    DTR_INTERNAL_ASSERT(nesting_allows(current, i, to), "planned {} -> {} on mesh dim {} of {}", current[i], to, i,
                        placements_str(current));
    RedistributeStep step{i, current[i], to, step_op(current[i], to, mesh.shape()[i]), current, {}, {}, {}, {}};
    current[i] = to;
    step.after = current;
    step.send_bytes.assign(mesh.size(), 0);
    step.buffer_bytes.assign(mesh.size(), 0);
    step.recv_bytes.assign(mesh.size(), 0);
    steps.push_back(std::move(step));
  };
  auto move = [&](int64_t i, Placement to) {
    if (to.is_partial() && !current[i].is_partial()) to = Replicate();  // the last pass makes it Partial
    if (current[i] != to) emit(i, to);
  };
  const bool source_has_shard =
      std::any_of(source.begin(), source.end(), [](const Placement& p) { return p.is_shard(); });
  if (source_has_shard) {
    for (int64_t i = m - 1; i >= 0; --i) {
      Placement to = target[i];
      if (to.is_shard() && sharders_before(current, i, to.shard_dim()) != sharders_before(target, i, to.shard_dim())) {
        to = Replicate();
      }
      move(i, to);
    }
  }
  // Outer -> inner: moves to Shard first, so that the all_reduces that remain run on
  // scattered data (HSDP's (P, P) -> (R, S(0)) reduce_scatters before it all_reduces).
  for (int64_t i = 0; i < m; ++i) {
    if (target[i].is_shard()) move(i, target[i]);
  }
  for (int64_t i = 0; i < m; ++i) move(i, target[i]);
  for (int64_t i = 0; i < m; ++i) {
    if (current[i] != target[i]) emit(i, target[i]);
  }
  return steps;
}

// Elements of `shape` outside the dims in `skip`.
int64_t numel_without(const Shape& shape, std::initializer_list<int64_t> skip) {
  int64_t n = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (std::find(skip.begin(), skip.end(), d) == skip.end()) n *= shape[d];
  }
  return n;
}

// Adds the bytes every rank sends and receives when `spec`'s tensor takes `step`.
// Every rank of a group works on the same piece (its box with the step's mesh dim
// replicated), chunked into n padded blocks (counts: docs/redistribute_planner.md).
void add_step_bytes(const DTensorSpec& spec, RedistributeStep& step) {
  if (!is_collective(step.op)) return;
  const DeviceMesh& mesh = spec.mesh();
  const int64_t n = mesh.shape()[step.mesh_dim];
  Placements group_view = step.before;
  group_view[step.mesh_dim] = Replicate();
  const int64_t itemsize = static_cast<int64_t>(dtr::itemsize(spec.dtype()));
  for (int64_t k = 0; k < mesh.size(); ++k) {
    const Shape piece = compute_local_box(mesh, group_view, spec.shape(), mesh.coordinate_at(k)).shape;
    // Elements of one padded block (sent to or received from each of the n - 1 peers).
    int64_t block = 0;
    switch (step.op) {
      case StepOp::kAllGather:
      case StepOp::kReduceScatter: {
        const int64_t d = step.op == StepOp::kAllGather ? step.from.shard_dim() : step.to.shard_dim();
        block = chunk_capacity(piece[d], n) * numel_without(piece, {d});
        break;
      }
      case StepOp::kAllToAll: {
        const int64_t a = step.from.shard_dim(), b = step.to.shard_dim();
        block = chunk_capacity(piece[a], n) * chunk_capacity(piece[b], n) * numel_without(piece, {a, b});
        break;
      }
      default: break;
    }
    const bool all_reduce = step.op == StepOp::kAllReduce;
    const int64_t moved = all_reduce ? 2 * (n - 1) * chunk_capacity(shape_numel(piece), n) : (n - 1) * block;
    step.send_bytes[k] += moved * itemsize;
    step.recv_bytes[k] += moved * itemsize;
    step.buffer_bytes[k] += (all_reduce ? shape_numel(piece) : n * block) * itemsize;
  }
}

// A Partial cannot change its reduce op in place: P(op1) -> P(op2) goes through Replicate.
bool changes_partial_op(const Placement& from, const Placement& to) {
  return from.is_partial() && to.is_partial() && from != to;
}

// The target checked against `spec` (length, Shard dims; negative dims wrapped), with
// errors that say they come from redistribute.
Placements checked_target(const DTensorSpec& spec, const Placements& target) {
  const std::string context = fmt::format("redistribute {} to {}: ", spec.to_string(), placements_str(target));
  try {
    return spec.with_placements(target).placements();
  } catch (const IndexError& e) {
    throw IndexError(context + e.what());
  } catch (const ValueError& e) {
    throw ValueError(context + e.what());
  }
}

}  // namespace

RedistributePlan::RedistributePlan(std::vector<DTensorSpec> sources, Placements target,
                                   std::vector<RedistributeStep> steps)
    : sources_(std::move(sources)), target_(std::move(target)), steps_(std::move(steps)) {
  DTR_INTERNAL_ASSERT(!sources_.empty(), "a plan with no tensors");
}

int64_t RedistributePlan::num_collectives() const {
  return std::count_if(steps_.begin(), steps_.end(), [](const RedistributeStep& s) { return is_collective(s.op); });
}

std::vector<int64_t> RedistributePlan::total_send_bytes() const {
  std::vector<int64_t> total(mesh().size(), 0);
  for (const RedistributeStep& s : steps_) {
    for (size_t k = 0; k < total.size(); ++k) total[k] += s.send_bytes[k];
  }
  return total;
}

std::vector<int64_t> RedistributePlan::total_recv_bytes() const {
  std::vector<int64_t> total(mesh().size(), 0);
  for (const RedistributeStep& s : steps_) {
    for (size_t k = 0; k < total.size(); ++k) total[k] += s.recv_bytes[k];
  }
  return total;
}

std::string RedistributePlan::explain() const {
  const DeviceMesh& m = mesh();
  std::vector<std::string> tensors;
  for (const DTensorSpec& s : sources_) tensors.push_back(fmt::format("{}{}", s.dtype(), s.shape()));
  std::string out = fmt::format(
      "redistribute {}{}: {} -> {} on {}\n", sources_.size() == 1 ? "" : fmt::format("{} tensors ", sources_.size()),
      fmt::join(tensors, ", "), placements_str(source_placements()), placements_str(target_), m.to_string());
  if (steps_.empty()) return out + "no steps: the placements already match\n";
  const int64_t collectives = num_collectives();
  out += fmt::format("{} step{}, {} collective{}:\n", steps_.size(), steps_.size() == 1 ? "" : "s", collectives,
                     collectives == 1 ? "" : "s");
  for (size_t k = 0; k < steps_.size(); ++k) {
    const RedistributeStep& s = steps_[k];
    std::string what;
    switch (s.op) {
      case StepOp::kAllGather:
      case StepOp::kAllToAll:
        what = fmt::format("{} over groups {}", step_op_name(s.op), m.group_ranks(s.mesh_dim));
        break;
      case StepOp::kAllReduce:
        what =
            fmt::format("all_reduce({}) over groups {}", reduce_op_name(s.from.reduce_op()), m.group_ranks(s.mesh_dim));
        break;
      case StepOp::kReduceScatter:
        what = fmt::format("reduce_scatter({}) over groups {}", reduce_op_name(s.from.reduce_op()),
                           m.group_ranks(s.mesh_dim));
        break;
      case StepOp::kChunk: what = "chunk (local: each rank keeps its chunk)"; break;
      case StepOp::kPartition: what = "partition (local: coordinate 0 keeps the value, the others hold zeros)"; break;
      case StepOp::kRelabel: what = "relabel (no data changes)"; break;
    }
    out += fmt::format("  step {}: mesh dim {}: {} -> {}, {}\n", k + 1, m.dim_label(s.mesh_dim), s.from, s.to, what);
  }
  if (collectives == 0) return out + "no communication\n";
  out += "bytes per rank (chunks padded to ceil(size/n), so every rank of a group sends equal buffers):\n";
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"rank", "coord"};
  for (size_t k = 0; k < steps_.size(); ++k) {
    if (is_collective(steps_[k].op)) header.push_back(fmt::format("step {} send/recv", k + 1));
  }
  header.insert(header.end(), {"total send", "total recv"});
  rows.push_back(std::move(header));
  const std::vector<int64_t> send = total_send_bytes(), recv = total_recv_bytes();
  for (int64_t r = 0; r < m.size(); ++r) {
    std::vector<std::string> row = {fmt::format("{}", m.ranks()[r]),
                                    fmt::format("({})", fmt::join(m.coordinate_at(r), ", "))};
    for (const RedistributeStep& s : steps_) {
      if (is_collective(s.op)) row.push_back(fmt::format("{}/{}", s.send_bytes[r], s.recv_bytes[r]));
    }
    row.insert(row.end(), {fmt::format("{}", send[r]), fmt::format("{}", recv[r])});
    rows.push_back(std::move(row));
  }
  return out + internal::format_table(rows);
}

RedistributePlan plan_redistribute(const DTensorSpec& source, const Placements& target) {
  return plan_redistribute_coalesced(std::span(&source, 1), target);
}

bool can_redistribute(const DTensorSpec& source, const Placements& target) {
  if (!DTensorSpec::is_valid(source.mesh(), target, source.shape())) return false;
  for (size_t i = 0; i < target.size(); ++i) {
    if (changes_partial_op(source.placements()[i], target[i])) return false;
  }
  return true;
}

RedistributePlan plan_redistribute_coalesced(std::span<const DTensorSpec> sources, const Placements& target) {
  DTR_CHECK(!sources.empty(), ValueError, "redistribute (coalesced) to {}: no tensors given", placements_str(target));
  const DTensorSpec& first = sources.front();
  const Placements dst = checked_target(first, target);
  for (size_t k = 1; k < sources.size(); ++k) {
    const DTensorSpec& s = sources[k];
    DTR_CHECK(s.mesh() == first.mesh(), ValueError,
              "redistribute (coalesced): tensor #{} ({}{}) is on {} but tensor #0 ({}{}) is on {}; tensors moved "
              "together must share one mesh",
              k, s.dtype(), s.shape(), s.mesh().to_string(), first.dtype(), first.shape(), first.mesh().to_string());
    DTR_CHECK(s.placements() == first.placements() && checked_target(s, target) == dst, ValueError,
              "redistribute (coalesced): tensor #{} ({}{}) moves {} -> {} but tensor #0 ({}{}) moves {} -> {}; "
              "tensors moved together must make the same move",
              k, s.dtype(), s.shape(), placements_str(s.placements()), placements_str(checked_target(s, target)),
              first.dtype(), first.shape(), placements_str(first.placements()), placements_str(dst));
  }
  const Placements& src = first.placements();
  for (size_t i = 0; i < src.size(); ++i) {
    DTR_CHECK(!changes_partial_op(src[i], dst[i]), ValueError,
              "redistribute {} to {}: mesh dim {} would go from {} to {}, but a Partial cannot change its reduce "
              "op; legal: reduce it first ({} -> Replicate), then redistribute Replicate -> {}",
              first.to_string(), placements_str(dst), first.mesh().dim_label(static_cast<int64_t>(i)), src[i].repr(),
              dst[i].repr(), src[i].repr(), dst[i].repr());
  }
  std::vector<RedistributeStep> steps = plan_steps(first.mesh(), src, dst);
  for (RedistributeStep& step : steps) {
    for (const DTensorSpec& s : sources) add_step_bytes(s, step);
  }
  return RedistributePlan(std::vector<DTensorSpec>(sources.begin(), sources.end()), dst, std::move(steps));
}

}  // namespace dtr
