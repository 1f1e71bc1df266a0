#include "dtensor/redistribute_plan.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

#include "collectives/reduce_op.h"
#include "core/error.h"
#include "dtensor/chunking.h"
#include "kernels/block_reduce.h"

namespace dtr {

std::string_view step_op_name(StepOp op) {
  switch (op) {
    case StepOp::kAllGather: return "all_gather";
    case StepOp::kAllToAll: return "all_to_all";
    case StepOp::kAllReduce: return "all_reduce";
    case StepOp::kReduceScatter: return "reduce_scatter";
    case StepOp::kChunk: return "chunk";
    case StepOp::kPad: return "pad";
    case StepOp::kPartition: return "partition";
    case StepOp::kRelabel: return "relabel";
  }
  return "?";
}

bool is_collective(StepOp op) {
  return op == StepOp::kAllGather || op == StepOp::kAllToAll || op == StepOp::kAllReduce ||
         op == StepOp::kReduceScatter;
}

bool sums_partial(const RedistributeStep& step) {
  const bool reduces = step.op == StepOp::kAllReduce || step.op == StepOp::kReduceScatter;
  return reduces && step.from.is_partial() && is_linear(step.from.reduce_op());
}

CollectiveKind collective_kind(StepOp op) {
  switch (op) {
    case StepOp::kAllGather: return CollectiveKind::kAllGather;
    case StepOp::kReduceScatter: return CollectiveKind::kReduceScatter;
    case StepOp::kAllToAll: return CollectiveKind::kAllToAll;
    case StepOp::kAllReduce: return CollectiveKind::kAllReduce;
    default: DTR_INTERNAL_ASSERT(false, "{} is not a collective", step_op_name(op));
  }
}

namespace {

// The op that moves one mesh dim of size mesh_size from `from` to `to` (from != to).
StepOp step_op(const Placement& from, const Placement& to, int64_t mesh_size) {
  if (mesh_size == 1) return StepOp::kRelabel;
  if (from.is_strided_shard()) return StepOp::kAllGather;  // legal_move allows only -> R
  if (from.is_shard()) {
    if (to.is_partial()) return StepOp::kPad;
    return to.is_replicate() ? StepOp::kAllGather : StepOp::kAllToAll;
  }
  if (from.is_partial()) return to.is_replicate() ? StepOp::kAllReduce : StepOp::kReduceScatter;
  if (to.splits_a_dim()) return StepOp::kChunk;
  return to.reduce_op() == ReduceOp::kSum ? StepOp::kPartition : StepOp::kRelabel;
}

// The mesh dims before `mesh_dim` that split tensor dim `dim`, with their placements.
std::vector<std::pair<int64_t, Placement>> sharders_before(const Placements& placements, int64_t mesh_dim,
                                                           int64_t dim) {
  std::vector<std::pair<int64_t, Placement>> dims;
  for (int64_t j = 0; j < mesh_dim; ++j) {
    if (placements[j].splits_dim(dim)) dims.emplace_back(j, placements[j]);
  }
  return dims;
}

// The nesting rule: mesh dim i may drop or add Shard(d) (or StridedShard(d, s)) only when
// no later mesh dim splits d (its chunks would otherwise be chunks of the wrong piece).
bool nesting_allows(const Placements& current, int64_t mesh_dim, const Placement& to) {
  for (const Placement& p : {current[mesh_dim], to}) {
    if (!p.splits_a_dim()) continue;
    for (size_t j = mesh_dim + 1; j < current.size(); ++j) {
      if (current[j].splits_dim(p.shard_dim())) return false;
    }
  }
  return true;
}

// A StridedShard comes from Replicate (chunk) or Partial (reduce_scatter) and goes to
// Replicate (all_gather); to or from a Shard or Partial it goes through Replicate.
bool strided_move_allowed(const Placement& from, const Placement& to) {
  if (from.is_strided_shard()) return to.is_replicate();
  if (to.is_strided_shard()) return from.is_replicate() || from.is_partial();
  return true;
}

// Whether mesh dim i of `spec`'s tensor, now under `current`, may move to `to` in one step:
// the nesting rule, no Partial -> Partial, no Shard -> Partial(avg) (its pad would scale by
// the group size, which is not exact), and a valid spec after it (no Partial ops that do
// not commute).
bool legal_move(const DTensorSpec& spec, const Placements& current, int64_t i, const Placement& to) {
  const Placement& from = current[i];
  if (from == to || !nesting_allows(current, i, to) || !strided_move_allowed(from, to)) return false;
  if (from.is_partial() && to.is_partial()) return false;
  if (from.is_shard() && to == Partial(ReduceOp::kAvg)) return false;
  Placements after = current;
  after[i] = to;
  return DTensorSpec::is_valid(spec.mesh(), after, spec.shape(), spec.dtype());
}

// How a candidate moves a mesh dim from Shard to a Partial target.
enum class ShardToPartial : uint8_t {
  kPadLast,           // pad in the last pass, after the other mesh dims' collectives
  kPadFirst,          // pad as soon as the dim is visited
  kThroughReplicate,  // all_gather, then partition or relabel
};

std::string_view shard_to_partial_name(ShardToPartial how) {
  switch (how) {
    case ShardToPartial::kPadLast: return "Shard -> Partial padded last";
    case ShardToPartial::kPadFirst: return "Shard -> Partial padded first";
    case ShardToPartial::kThroughReplicate: return "Shard -> Partial through Replicate";
  }
  return "?";
}

RedistributeStep make_step(const DeviceMesh& mesh, const Placements& before, int64_t i, const Placement& to) {
  Placements after = before;
  after[i] = to;
  const size_t n = static_cast<size_t>(mesh.size());
  return {i,
          1,
          before[i],
          to,
          step_op(before[i], to, mesh.shape()[i]),
          before,
          std::move(after),
          std::vector<int64_t>(n),
          std::vector<int64_t>(n),
          std::vector<int64_t>(n)};
}

// Whether a greedy pass is pass 4 below, where a Partial target no longer waits.
enum class LastPass : uint8_t { kNo, kYes };

// Whether a candidate runs pass 2 below (Shard targets first: a reduce-scatter before the
// all-reduces, on the smaller piece), or leaves every dim to pass 3's order (under
// --deterministic, so that an inner all-reduce can come before an outer reduce-scatter).
enum class ShardTargetsFirst : uint8_t { kYes, kNo };

// One candidate: greedy passes, repeated until the target is reached (or nothing moves).
// 1. If a mesh dim holds a Shard, visit `unshard_order` and move each to its target,
//    except that a target Shard(d) becomes Replicate when the mesh dims before it shard d
//    differently now and in the target (misaligned nesting) or when the move is one a
//    StridedShard makes through Replicate.
// 2. Visit `order`, moving every mesh dim whose target is a Shard to it (ShardTargetsFirst).
// 3. Visit `order`, moving every mesh dim to its target, a Partial one to Replicate for now.
// 4. Visit `order`, moving every mesh dim still off its target.
// A Shard with a Partial target pads in pass 1 (kPadFirst) or 4 (kPadLast), or goes through
// Replicate. Moves that are not legal yet wait for a later pass. nullopt when stuck.
std::optional<std::vector<RedistributeStep>> greedy_steps(const DTensorSpec& spec, const Placements& target,
                                                          std::span<const int64_t> unshard_order,
                                                          std::span<const int64_t> order, ShardToPartial s2p,
                                                          ShardTargetsFirst shard_first) {
  const DeviceMesh& mesh = spec.mesh();
  std::vector<RedistributeStep> steps;
  Placements current = spec.placements();
  auto try_move = [&](int64_t i, const Placement& to) {
    if (!legal_move(spec, current, i, to)) return;
    steps.push_back(make_step(mesh, current, i, to));
    current = steps.back().after;
  };
  // Where mesh dim i heads in a pass: its target, or Replicate (or its Shard) for a Partial
  // target that must wait (until the last pass).
  auto waypoint = [&](int64_t i, LastPass pass) {
    const bool last_pass = pass == LastPass::kYes;
    const Placement& to = target[i];
    const Placement& from = current[i];
    if (!to.is_partial() || from.is_partial()) return to;
    if (from.is_shard() && to.reduce_op() != ReduceOp::kAvg && s2p != ShardToPartial::kThroughReplicate) {
      return s2p == ShardToPartial::kPadFirst || last_pass ? to : from;
    }
    return last_pass ? to : Replicate();
  };
  auto has_shard = [&] {
    return std::any_of(current.begin(), current.end(), [](const Placement& p) { return p.splits_a_dim(); });
  };
  for (int64_t round = 0; round <= mesh.ndim() && current != target; ++round) {
    const size_t steps_before = steps.size();
    if (has_shard()) {
      for (int64_t i : unshard_order) {
        Placement to = waypoint(i, LastPass::kNo);
        if (to.splits_a_dim() &&
            (sharders_before(current, i, to.shard_dim()) != sharders_before(target, i, to.shard_dim()) ||
             !strided_move_allowed(current[i], to))) {
          to = Replicate();
        }
        try_move(i, to);
      }
    }
    for (int64_t i : order) {
      if (shard_first == ShardTargetsFirst::kYes && target[i].splits_a_dim()) try_move(i, target[i]);
    }
    for (int64_t i : order) try_move(i, waypoint(i, LastPass::kNo));
    for (int64_t i : order) try_move(i, waypoint(i, LastPass::kYes));
    if (steps.size() == steps_before) break;
  }
  if (current != target) return std::nullopt;
  return steps;
}

// Whether steps a then b are one collective on adjacent mesh dims that a single collective
// over those dims flattened can do: all_gathers of one Shard(d), inner dim first;
// reduce_scatters of one op to one Shard(d), outer dim first; all_reduces of one op.
bool mergeable(const RedistributeStep& a, const RedistributeStep& b) {
  if (a.op != b.op || a.from != b.from || a.to != b.to) return false;
  if (a.from.is_strided_shard() || a.to.is_strided_shard()) return false;  // no flattened strided rule
  const int64_t a_end = a.mesh_dim + a.num_mesh_dims, b_end = b.mesh_dim + b.num_mesh_dims;
  switch (a.op) {
    case StepOp::kAllGather: return b_end == a.mesh_dim;
    case StepOp::kReduceScatter: return a_end == b.mesh_dim;
    case StepOp::kAllReduce: return b_end == a.mesh_dim || a_end == b.mesh_dim;
    default: return false;
  }
}

// The steps that sum a Partial (sums_partial), in order.
std::vector<const RedistributeStep*> sum_reductions(const std::vector<RedistributeStep>& steps) {
  std::vector<const RedistributeStep*> out;
  for (const RedistributeStep& s : steps) {
    if (sums_partial(s)) out.push_back(&s);
  }
  return out;
}

// A candidate plan: its steps and how it was built.
using Candidates = std::vector<std::pair<std::vector<RedistributeStep>, std::string>>;

// Under --deterministic a Partial sums in the canonical tree of the blocks its ranks hold
// (rank r of the reduced mesh dims, row-major, holding block r). One collective over those
// dims flattened does, whatever the group sizes (redistribute.cc's tree over the group);
// collectives per dim do from the innermost out while the inner groups are powers of two
// (the only plans where the mesh cannot flatten the dims); outermost first adds blocks that
// are no node (on 2 x 2: (r0 + r2) + (r1 + r3)). So the candidates are cut to the plans
// summing inner dims first, in the fewest such steps; none is cut where none would be left.
void keep_tree_order(Candidates& candidates) {
  auto inner_first = [](const std::vector<RedistributeStep>& steps) {
    const std::vector<const RedistributeStep*> r = sum_reductions(steps);
    for (size_t i = 1; i < r.size(); ++i) {
      if (r[i]->mesh_dim + r[i]->num_mesh_dims > r[i - 1]->mesh_dim) return false;
    }
    return true;
  };
  Candidates kept;
  for (auto& c : candidates) {
    if (inner_first(c.first)) kept.push_back(std::move(c));
  }
  if (kept.empty()) return;
  size_t fewest = sum_reductions(kept.front().first).size();
  for (const auto& c : kept) fewest = std::min(fewest, sum_reductions(c.first).size());
  std::erase_if(kept, [&](const auto& c) { return sum_reductions(c.first).size() > fewest; });
  candidates = std::move(kept);
}

// `steps` with every run of mergeable steps over a range the mesh can flatten made one.
std::vector<RedistributeStep> merge_steps(const DeviceMesh& mesh, const std::vector<RedistributeStep>& steps) {
  std::vector<RedistributeStep> merged;
  for (const RedistributeStep& step : steps) {
    if (!merged.empty() && mergeable(merged.back(), step)) {
      RedistributeStep& last = merged.back();
      const int64_t first = std::min(last.mesh_dim, step.mesh_dim);
      const int64_t count = last.num_mesh_dims + step.num_mesh_dims;
      if (mesh.can_flatten(first, count)) {
        last.mesh_dim = first;
        last.num_mesh_dims = count;
        last.after = step.after;
        continue;
      }
    }
    merged.push_back(step);
  }
  return merged;
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
// Every rank of a group works on the same piece (its chunk with the step's mesh dims
// replicated), chunked into n padded blocks (counts: docs/redistribute_planner.md).
void add_step_bytes(const DTensorSpec& spec, RedistributeStep& step) {
  if (!is_collective(step.op)) return;
  const DeviceMesh& mesh = spec.mesh();
  Placements group_view = step.before;
  int64_t n = 1;
  for (int64_t i = step.mesh_dim; i < step.mesh_dim + step.num_mesh_dims; ++i) {
    group_view[i] = Replicate();
    n *= mesh.shape()[i];
  }
  const int64_t itemsize = static_cast<int64_t>(dtr::itemsize(spec.dtype()));
  for (int64_t k = 0; k < mesh.size(); ++k) {
    const Shape piece = local_shape_of(compute_local_ranges(mesh, group_view, spec.shape(), mesh.coordinate_at(k)));
    // Elements of one padded block (sent to or received from each of the n - 1 peers).
    int64_t block = 0;
    switch (step.op) {
      case StepOp::kAllGather:
      case StepOp::kReduceScatter: {
        const Placement& split = step.op == StepOp::kAllGather ? step.from : step.to;
        const int64_t d = split.shard_dim();
        block = strided_capacity(piece[d], split.split_factor(), n) * numel_without(piece, {d});
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

// The target checked against `spec` (length, Shard dims, dtype; negative dims wrapped),
// with errors that say they come from redistribute.
Placements checked_target(const DTensorSpec& spec, const Placements& target) {
  const std::string context = fmt::format("redistribute {} to {}: ", spec.to_string(), placements_str(target));
  try {
    return spec.with_placements(target).placements();
  } catch (const IndexError& e) {
    throw IndexError(context + e.what());
  } catch (const TypeError& e) {
    throw TypeError(context + e.what());
  } catch (const ValueError& e) {
    throw ValueError(context + e.what());
  }
}

// Which mesh dim a greedy pass visits first: the innermost (last) or the outermost (0).
enum class MeshDimOrder : uint8_t { kInnerFirst, kOuterFirst };

// Every order of the mesh dims, the greedy default (inner -> outer, or outer -> inner) first.
std::vector<std::vector<int64_t>> mesh_dim_orders(int64_t m, MeshDimOrder first) {
  std::vector<int64_t> order(m);
  for (int64_t i = 0; i < m; ++i) order[i] = first == MeshDimOrder::kInnerFirst ? m - 1 - i : i;
  std::vector<std::vector<int64_t>> orders = {order};
  std::vector<int64_t> perm = order;
  std::sort(perm.begin(), perm.end());
  do {
    if (perm != order) orders.push_back(perm);
  } while (std::next_permutation(perm.begin(), perm.end()));
  return orders;
}

bool same_moves(const std::vector<RedistributeStep>& a, const std::vector<RedistributeStep>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const RedistributeStep& x, const RedistributeStep& y) {
    return x.mesh_dim == y.mesh_dim && x.num_mesh_dims == y.num_mesh_dims && x.after == y.after;
  });
}

std::string order_str(std::span<const int64_t> order) { return fmt::format("{}", fmt::join(order, ", ")); }

// The checks shared by the single and coalesced forms; returns the checked target.
Placements checked_move(std::span<const DTensorSpec> sources, const Placements& target) {
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
  return dst;
}

// The distinct candidate plans for a move checked_move accepted (dst is its result).
std::vector<RedistributePlan> candidate_plans(std::span<const DTensorSpec> sources, const Placements& dst) {
  const DTensorSpec& first = sources.front();
  const DeviceMesh& mesh = first.mesh();
  const Placements& src = first.placements();
  bool shard_to_partial = false;
  for (size_t i = 0; i < src.size(); ++i) shard_to_partial |= src[i].is_shard() && dst[i].is_partial();
  std::vector<ShardToPartial> s2p_ways = {ShardToPartial::kThroughReplicate};
  if (shard_to_partial)
    s2p_ways = {ShardToPartial::kPadLast, ShardToPartial::kPadFirst, ShardToPartial::kThroughReplicate};

  Candidates candidates;
  auto add = [&](std::vector<RedistributeStep> steps, std::string how) {
    for (const auto& c : candidates) {
      if (same_moves(c.first, steps)) return;
    }
    candidates.emplace_back(std::move(steps), std::move(how));
  };
  const bool deterministic = deterministic_block_tokens() > 0;
  std::vector<ShardTargetsFirst> shard_first_ways = {ShardTargetsFirst::kYes};
  if (deterministic) shard_first_ways.push_back(ShardTargetsFirst::kNo);
  for (const std::vector<int64_t>& unshard : mesh_dim_orders(mesh.ndim(), MeshDimOrder::kInnerFirst)) {
    for (const std::vector<int64_t>& order : mesh_dim_orders(mesh.ndim(), MeshDimOrder::kOuterFirst)) {
      for (ShardToPartial s2p : s2p_ways) {
        for (ShardTargetsFirst shard_first : shard_first_ways) {
          std::optional<std::vector<RedistributeStep>> steps =
              greedy_steps(first, dst, unshard, order, s2p, shard_first);
          if (!steps) continue;
          std::string how = mesh.ndim() == 1 ? std::string("one mesh dim")
                                             : fmt::format("unshard over mesh dims ({}), then ({})", order_str(unshard),
                                                           order_str(order));
          if (shard_to_partial) how += fmt::format(", {}", shard_to_partial_name(s2p));
          if (shard_first == ShardTargetsFirst::kNo) how += ", Shard targets in that order";
          std::vector<RedistributeStep> merged = merge_steps(mesh, *steps);
          if (merged.size() != steps->size()) add(std::move(merged), how + ", merged");
          add(std::move(*steps), how);
        }
      }
    }
  }
  if (deterministic) keep_tree_order(candidates);
  DTR_INTERNAL_ASSERT(!candidates.empty(), "no plan for {} -> {}", first.to_string(), placements_str(dst));
  std::vector<RedistributePlan> plans;
  for (auto& [steps, how] : candidates) {
    for (RedistributeStep& step : steps) {
      for (const DTensorSpec& s : sources) add_step_bytes(s, step);
    }
    plans.emplace_back(std::vector<DTensorSpec>(sources.begin(), sources.end()), dst, std::move(steps), std::move(how));
  }
  return plans;
}

}  // namespace

RedistributePlan::RedistributePlan(std::vector<DTensorSpec> sources, Placements target,
                                   std::vector<RedistributeStep> steps, std::string strategy)
    : sources_(std::move(sources)),
      target_(std::move(target)),
      steps_(std::move(steps)),
      strategy_(std::move(strategy)) {
  DTR_CHECK(!sources_.empty(), ValueError,
            "RedistributePlan: a plan to {} ({}) moves no tensors; give it at least one source spec",
            placements_str(target_), strategy_);
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

int64_t RedistributePlan::max_send_bytes() const {
  const std::vector<int64_t> send = total_send_bytes();
  return *std::max_element(send.begin(), send.end());
}

RedistributePlan plan_redistribute(const DTensorSpec& source, const Placements& target) {
  return plan_redistribute_coalesced(std::span(&source, 1), target);
}

std::vector<RedistributePlan> plan_alternatives(const DTensorSpec& source, const Placements& target) {
  return plan_alternatives_coalesced(std::span(&source, 1), target);
}

std::vector<RedistributePlan> plan_alternatives_coalesced(std::span<const DTensorSpec> sources,
                                                          const Placements& target) {
  return candidate_plans(sources, checked_move(sources, target));
}

size_t best_plan_index(const std::vector<RedistributePlan>& alternatives) {
  DTR_CHECK(!alternatives.empty(), ValueError,
            "best_plan_index: no plans to choose from; pass plan_alternatives' result, which holds at least one");
  size_t best = 0;
  for (size_t k = 1; k < alternatives.size(); ++k) {
    if (plan_cost(alternatives[k]) < plan_cost(alternatives[best])) best = k;
  }
  return best;
}

PlanCost plan_cost(const RedistributePlan& plan) {
  const std::vector<int64_t> send = plan.total_send_bytes();
  return {plan.max_send_bytes(), std::accumulate(send.begin(), send.end(), int64_t{0}), plan.num_collectives(),
          static_cast<int64_t>(plan.steps().size())};
}

bool can_redistribute(const DTensorSpec& source, const Placements& target) {
  if (!DTensorSpec::is_valid(source.mesh(), target, source.shape(), source.dtype())) return false;
  for (size_t i = 0; i < target.size(); ++i) {
    if (changes_partial_op(source.placements()[i], target[i])) return false;
  }
  return true;
}

RedistributePlan plan_redistribute_coalesced(std::span<const DTensorSpec> sources, const Placements& target) {
  const Placements dst = checked_move(sources, target);
  // The chosen steps depend only on the mesh's layout and flattened groups, the placements
  // and every tensor's shape and dtype: cached per thread under those (PyTorch caches its
  // plans too), since ops plan the same moves at every step.
  std::vector<int64_t> key;
  const DeviceMesh& mesh = sources.front().mesh();
  key.insert(key.end(), mesh.shape().begin(), mesh.shape().end());
  key.insert(key.end(), mesh.ranks().begin(), mesh.ranks().end());
  for (int64_t first = 0; first < mesh.ndim(); ++first) {
    for (int64_t count = 2; first + count <= mesh.ndim(); ++count) key.push_back(mesh.can_flatten(first, count));
  }
  for (const Placements* list : {&sources.front().placements(), &dst}) {
    for (const Placement& p : *list) {
      // One code per placement: 0 for Replicate, 1 + op for Partial, 16 + dim for Shard, and
      // 8 followed by the dim and the split factor for StridedShard.
      if (p.is_strided_shard()) {
        key.insert(key.end(), {8, p.shard_dim(), p.split_factor()});
        continue;
      }
      key.push_back(p.is_replicate() ? 0
                    : p.is_partial() ? 1 + static_cast<int64_t>(p.reduce_op())
                                     : 16 + p.shard_dim());
    }
  }
  key.push_back(deterministic_block_tokens() > 0 ? -100 : -101);  // keep_tree_order's candidates, or all
  for (const DTensorSpec& s : sources) {
    key.push_back(-1 - static_cast<int64_t>(s.dtype()));  // negative: separates the shapes
    key.insert(key.end(), s.shape().begin(), s.shape().end());
  }
  struct Chosen {
    std::vector<RedistributeStep> steps;
    std::string strategy;
  };
  thread_local std::map<std::vector<int64_t>, Chosen> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= 4096) cache.clear();  // a bound, not an LRU: programs plan a few hundred moves
    std::vector<RedistributePlan> plans = candidate_plans(sources, dst);
    RedistributePlan& best = plans[best_plan_index(plans)];
    it = cache.emplace(std::move(key), Chosen{best.steps(), best.strategy()}).first;
  }
  return RedistributePlan(std::vector<DTensorSpec>(sources.begin(), sources.end()), dst, it->second.steps,
                          it->second.strategy);
}

}  // namespace dtr
