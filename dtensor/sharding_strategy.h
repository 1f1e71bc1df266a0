// Sharding strategies: how an op chooses the placements it runs with (PyTorch's
// OpStrategy and single-mesh-dim strategies, with _select_min_cost_strategy's choice).
//
// An op lists, for ONE mesh dim, the legal combinations of input and output placements
// (DimStrategy: e.g. matmul's (S(0), R -> S(0)), (R, S(1) -> S(1)), (S(1), S(0) -> P(sum)),
// (R, R -> R)); expand_strategies takes their product over the mesh dims. apply_strategy
// picks the candidate whose input moves cost the fewest bytes, summed over every rank, so
// every rank picks the same one (the first among equals: list the no-communication ones
// first), redistributes the inputs to it (differentiably) and counts the collectives it
// promised, for tests to compare with those issued. An input is never moved from Shard to
// Partial to fit (free now, dearer later).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/collective_counter.h"
#include "core/trace.h"
#include "dtensor/dtensor.h"

namespace dtr {

// Placements for one mesh dim: one per input, one per output.
struct DimStrategy {
  std::vector<Placement> inputs;
  std::vector<Placement> outputs;
};

// Placements over every mesh dim: one list per input and per output.
struct OpStrategy {
  std::vector<Placements> inputs;
  std::vector<Placements> outputs;
};

// The product of per-mesh-dim candidates over mesh_ndim dims (each mesh dim chooses
// independently), in lexicographic order of the per-dim lists.
std::vector<OpStrategy> expand_strategies(std::span<const DimStrategy> per_dim, int64_t mesh_ndim);

// The chosen strategy and the inputs moved to its placements. While tracing is on, `span`
// times the op (category op, args inputs and strategy) from apply_strategy until the op's
// AppliedStrategy goes out of scope, the op's local kernels included.
struct AppliedStrategy {
  OpStrategy strategy;
  std::vector<DTensor> inputs;
  std::unique_ptr<trace::Span> span;
};

// Checks that the inputs share a mesh (ValueError naming them otherwise), picks the
// cheapest candidate and redistributes the inputs to it. No candidate fits: a ValueError
// naming the op, every input's spec and the placements the op accepts.
AppliedStrategy apply_strategy(std::string_view op, std::span<const DTensor> inputs,
                               std::span<const OpStrategy> candidates);

// An implicit redistribute: an input apply_strategy moved because the op's rule wanted other
// placements (no caller asked for it) with a move that communicates.
struct ImplicitRedistribute {
  std::string op;                           // "linear"
  std::string input;                        // describe() of the input as it arrived
  Placements to;                            // what the chosen strategy wanted
  std::vector<CollectiveKind> collectives;  // what the move issues, in plan order
};

// Watches this thread's implicit redistributes while alive (the previous watcher is restored
// after): `observe` is called before the move, and may throw to stop the op before anything
// moves (CommDebugMode's strict mode).
class ImplicitRedistributeWatch {
 public:
  explicit ImplicitRedistributeWatch(std::function<void(const ImplicitRedistribute&)> observe);
  ~ImplicitRedistributeWatch();
  ImplicitRedistributeWatch(const ImplicitRedistributeWatch&) = delete;
  ImplicitRedistributeWatch& operator=(const ImplicitRedistributeWatch&) = delete;

 private:
  std::function<void(const ImplicitRedistribute&)> previous_;
};

// An op's own collectives (the count of cross_entropy's targets, the row statistics of its
// class-sharded form) are part of its definition, not implicit: inside this scope
// apply_strategy reports no move to a watch.
class DeclaredCollectives {
 public:
  DeclaredCollectives();
  ~DeclaredCollectives();
  DeclaredCollectives(const DeclaredCollectives&) = delete;
  DeclaredCollectives& operator=(const DeclaredCollectives&) = delete;
};

// Collectives the strategies chosen on this thread promised since the last reset.
int64_t promised_collectives();
void reset_promised_collectives();

// "float32[8, 6] (S(0), R)": how op errors name an input.
std::string describe(const DTensor& t);

}  // namespace dtr
