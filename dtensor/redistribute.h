// redistribute: runs a RedistributePlan on this rank's local tensors, issuing exactly the
// collectives the plan lists, one per step (coalesced: one per step for all tensors).
//
// Each step works on the group of its mesh dims (flattened into one for a merged step)
// holding this rank. Uneven shards are padded to chunk_capacity before a collective and
// trimmed after it (the plan's byte counts assume it). Local results are fresh contiguous tensors: a redistribute never
// writes into or aliases its inputs. Bool tensors (masks) move as int32. Collectives run on
// the mesh's device: a local elsewhere (a CPU-offloaded shard under a CUDA mesh) is copied
// there for them and its result copied back to its own device; a pinned one is read when
// that queued copy runs, so it must not be written before the result has been waited for.
// With Async::kYes
// the first step's collective is issued at once and the rest run when the result is first
// needed, on the calling thread, so every rank issues its collectives in program order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "collectives/work.h"
#include "core/tensor.h"
#include "dtensor/redistribute_plan.h"

namespace dtr {

enum class Async : uint8_t { kNo, kYes };

// A redistribute in flight: locals of every source, under the plan's target placements
// once wait() returns.
class PendingRedistribute {
 public:
  // Issues the plan's first communicating step (and any local steps before it). The
  // results go to `device` (default: each local's own).
  PendingRedistribute(RedistributePlan plan, std::vector<Tensor> locals, std::optional<Device> device = std::nullopt);
  ~PendingRedistribute();
  PendingRedistribute(const PendingRedistribute&) = delete;
  PendingRedistribute& operator=(const PendingRedistribute&) = delete;

  // Finishes the step in flight and runs the remaining steps; idempotent.
  const std::vector<Tensor>& wait();
  const RedistributePlan& plan() const { return plan_; }

 private:
  struct InFlight;
  // Runs steps from next_step_ until one issues a collective (kept in in_flight_) or none remain.
  void advance();

  RedistributePlan plan_;
  std::vector<Tensor> locals_;
  std::vector<Device> homes_;  // each result's device
  size_t next_step_ = 0;
  std::unique_ptr<InFlight> in_flight_;
  bool done_ = false;  // wait() has finished: locals_ are the results
};

// Runs the whole plan and returns the new locals (blocking).
std::vector<Tensor> execute_redistribute(const RedistributePlan& plan, std::vector<Tensor> locals);

}  // namespace dtr
