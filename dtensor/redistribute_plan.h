// RedistributePlan: how a DTensor changes placements, as an ordered list of steps, each
// on one mesh dim or on adjacent mesh dims flattened into one group, with the bytes every
// rank sends and receives. Pure computation: an executor issues exactly its collectives.
//
// One mesh dim: S->R all_gather, S(i)->S(j) all_to_all, P->R all_reduce, P->S
// reduce_scatter; R->S chunk, R->P(sum) partition and S->P(sum|max|min) pad are local;
// S->P(avg) goes through R; P(op1)->P(op2) is an error. N-D moves take the cheapest of
// candidate plans (mesh dim orders, pad or not, merged or not), every step obeying the
// nesting rule. The plans as text: dtensor/explain.h. Rules, bytes and examples:
// docs/redistribute_planner.md.
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/collective_counter.h"
#include "dtensor/dtensor_spec.h"
#include "dtensor/placement.h"

namespace dtr {

// What one step does to the local data of the ranks of each group along its mesh dim.
enum class StepOp : uint8_t {
  kAllGather,      // S(d) -> R
  kAllToAll,       // S(a) -> S(b)
  kAllReduce,      // P(op) -> R, reducing with op
  kReduceScatter,  // P(op) -> S(d), reducing with op
  kChunk,          // R -> S(d): keep this rank's chunk, no communication
  kPad,            // S(d) -> P(sum|max|min): the shard at its offset, op's identity elsewhere
  kPartition,      // R -> P(sum): coordinate 0 keeps the value, the others hold zeros
  kRelabel,        // no data changes: R -> P(avg|max|min), or a mesh dim of size 1
};

// "all_gather", "all_to_all", "all_reduce", "reduce_scatter", "chunk", "pad", "partition",
// "relabel".
std::string_view step_op_name(StepOp op);
// True for the four ops that communicate.
bool is_collective(StepOp op);
// The CollectiveKind a collective step issues (InternalError for a local op).
CollectiveKind collective_kind(StepOp op);

struct RedistributeStep {
  // The mesh dims [mesh_dim, mesh_dim + num_mesh_dims) the step works on: one, or for a
  // merged collective several adjacent ones flattened into one group (row-major), each
  // going from `from` to `to`.
  int64_t mesh_dim;
  int64_t num_mesh_dims;
  Placement from;
  Placement to;
  StepOp op;
  Placements before;  // placements of every mesh dim before this step
  Placements after;   // and after it
  // Bytes each rank sends and receives in this step, indexed like mesh.ranks(), summed
  // over the tensors of a coalesced plan.
  std::vector<int64_t> send_bytes;
  std::vector<int64_t> recv_bytes;
  // The size of the collective's buffer on each rank, as nccl-tests and the
  // CollectiveCounter count it: all_gather's output, reduce_scatter's input, all_to_all's
  // input (n padded blocks each), all_reduce's tensor.
  std::vector<int64_t> buffer_bytes;
};

// Whether `step` sums a Partial (an all_reduce or reduce_scatter of sum or avg): the steps
// whose order rounds, which --deterministic runs in the canonical tree.
bool sums_partial(const RedistributeStep& step);

class RedistributePlan {
 public:
  // `strategy` says how the planner built the steps (the passes' orders, Shard -> Partial,
  // merging), for explain_alternatives (dtensor/explain.h). ValueError when `sources` is empty.
  RedistributePlan(std::vector<DTensorSpec> sources, Placements target, std::vector<RedistributeStep> steps,
                   std::string strategy);

  const DeviceMesh& mesh() const { return sources_.front().mesh(); }
  // The tensors that move: one, or several making the same move (coalesced).
  const std::vector<DTensorSpec>& sources() const { return sources_; }
  const Placements& source_placements() const { return sources_.front().placements(); }
  const Placements& target_placements() const { return target_; }
  const std::vector<RedistributeStep>& steps() const { return steps_; }
  const std::string& strategy() const { return strategy_; }
  int64_t num_collectives() const;
  // Bytes each rank sends / receives over the whole plan, indexed like mesh.ranks().
  std::vector<int64_t> total_send_bytes() const;
  std::vector<int64_t> total_recv_bytes() const;
  // The most any rank sends over the whole plan: what the planner minimises first.
  int64_t max_send_bytes() const;

 private:
  std::vector<DTensorSpec> sources_;
  Placements target_;
  std::vector<RedistributeStep> steps_;
  std::string strategy_;
};

// Plans moving `source` to `target` placements on the same mesh: the best of
// plan_alternatives. Throws ValueError / IndexError / TypeError for a target of the wrong
// length, a Shard dim out of range, a target spec that is not valid (Partial(avg) of an
// integer dtype), or P(op1) -> P(op2) (legal: P(op1) -> R -> P(op2), as two redistributes).
RedistributePlan plan_redistribute(const DTensorSpec& source, const Placements& target);

// Every distinct plan the planner weighs for the move, in the order it builds them; the
// chosen one has the fewest max_send_bytes, then the fewest total bytes, collectives and
// steps, then comes first. Under --deterministic (deterministic_block_tokens() > 0) only the
// plans that sum Partial mesh dims innermost first, in the fewest summing steps, are weighed
// (all, should none do): those sum the ranks' blocks in the canonical tree. Same errors as plan_redistribute.
// plan_redistribute caches its choice per thread, keyed by everything the steps depend on
// (mesh layout and flattened groups, placements, shapes, dtypes, the mode); these always search.
std::vector<RedistributePlan> plan_alternatives(const DTensorSpec& source, const Placements& target);
std::vector<RedistributePlan> plan_alternatives_coalesced(std::span<const DTensorSpec> sources,
                                                          const Placements& target);

// The index in `alternatives` of the plan plan_redistribute picks; ValueError when it is empty.
size_t best_plan_index(const std::vector<RedistributePlan>& alternatives);

// The ranking key of plans, compared member by member in this order: the bytes the busiest
// rank sends, the bytes sent in all, collectives, steps. The least is the best.
struct PlanCost {
  int64_t max_send_bytes;
  int64_t total_send_bytes;
  int64_t num_collectives;
  int64_t num_steps;
  auto operator<=>(const PlanCost&) const = default;
};
PlanCost plan_cost(const RedistributePlan& plan);

// Whether plan_redistribute(source, target) has a plan: the query form of its checks, for
// callers weighing candidate placements (it builds no message and throws nothing).
bool can_redistribute(const DTensorSpec& source, const Placements& target);

// One plan for several tensors making the same move (same mesh, same source placements):
// the steps of plan_redistribute, bytes summed over the tensors. ValueError naming the
// tensors, shapes, meshes and placements when they differ.
RedistributePlan plan_redistribute_coalesced(std::span<const DTensorSpec> sources, const Placements& target);

}  // namespace dtr
