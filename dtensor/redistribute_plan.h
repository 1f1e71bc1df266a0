// RedistributePlan: how a DTensor changes placements, as an ordered list of steps, each
// on one mesh dim, with the bytes every rank sends and receives. Pure computation: an
// executor runs the steps one by one and issues exactly the collectives listed.
//
// One mesh dim: S->R all_gather, S(i)->S(j) all_to_all, P->R all_reduce, P->S
// reduce_scatter, R->S chunk and R->P(sum) partition (both local), R->P(avg|max|min) and any
// move on a mesh dim of size 1 relabel; S->P goes through R; P(op1)->P(op2) is an error.
// N-D meshes take PyTorch's greedy order, in which a mesh dim adds or drops Shard(d) only as
// the innermost sharder of d. Bytes assume chunks padded to chunk_capacity. The order, the
// byte counts and worked examples: docs/redistribute_planner.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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
  kPartition,      // R -> P(sum): coordinate 0 keeps the value, the others hold zeros
  kRelabel,        // no data changes: R -> P(avg|max|min), or a mesh dim of size 1
};

// "all_gather", "all_to_all", "all_reduce", "reduce_scatter", "chunk", "partition", "relabel".
std::string_view step_op_name(StepOp op);
// True for the four ops that communicate.
bool is_collective(StepOp op);

struct RedistributeStep {
  int64_t mesh_dim;
  Placement from;
  Placement to;
  StepOp op;
  Placements before;  // placements of every mesh dim before this step
  Placements after;   // and after it (before with [mesh_dim] = to)
  // Bytes each rank sends and receives in this step, indexed like mesh.ranks(), summed
  // over the tensors of a coalesced plan.
  std::vector<int64_t> send_bytes;
  std::vector<int64_t> recv_bytes;
  // The size of the collective's buffer on each rank, as nccl-tests and the
  // CollectiveCounter count it: all_gather's output, reduce_scatter's input, all_to_all's
  // input (n padded blocks each), all_reduce's tensor.
  std::vector<int64_t> buffer_bytes;
};

class RedistributePlan {
 public:
  RedistributePlan(std::vector<DTensorSpec> sources, Placements target, std::vector<RedistributeStep> steps);

  const DeviceMesh& mesh() const { return sources_.front().mesh(); }
  // The tensors that move: one, or several making the same move (coalesced).
  const std::vector<DTensorSpec>& sources() const { return sources_; }
  const Placements& source_placements() const { return sources_.front().placements(); }
  const Placements& target_placements() const { return target_; }
  const std::vector<RedistributeStep>& steps() const { return steps_; }
  int64_t num_collectives() const;
  // Bytes each rank sends / receives over the whole plan, indexed like mesh.ranks().
  std::vector<int64_t> total_send_bytes() const;
  std::vector<int64_t> total_recv_bytes() const;

  // The steps, their collectives and groups, and a table of bytes per rank.
  std::string explain() const;

 private:
  std::vector<DTensorSpec> sources_;
  Placements target_;
  std::vector<RedistributeStep> steps_;
};

// Plans moving `source` to `target` placements on the same mesh. Throws ValueError /
// IndexError for a target of the wrong length, a Shard dim out of range, or
// P(op1) -> P(op2) (legal: P(op1) -> R -> P(op2), as two redistributes).
RedistributePlan plan_redistribute(const DTensorSpec& source, const Placements& target);

// Whether plan_redistribute(source, target) has a plan: the query form of its checks, for
// callers weighing candidate placements (it builds no message and throws nothing).
bool can_redistribute(const DTensorSpec& source, const Placements& target);

// One plan for several tensors making the same move (same mesh, same source placements):
// the steps of plan_redistribute, bytes summed over the tensors. ValueError naming the
// tensors, shapes, meshes and placements when they differ.
RedistributePlan plan_redistribute_coalesced(std::span<const DTensorSpec> sources, const Placements& target);

}  // namespace dtr
