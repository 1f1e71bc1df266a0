// CommDebugMode (PyTorch's torch.distributed.tensor.debug.CommDebugMode): which collectives a
// model issues, by module (its dotted name) and phase, and which op's sharding rule caused
// each implicit redistribute; its strict mode makes such a redistribute an error.
//
// While alive it watches `root` and this thread's ops. A collective counts for the module
// whose forward is running (its children's own aside; its styles' input and output layouts
// included), in phase "forward"; from the moment a module's backward starts (the first
// gradient of its outputs arrives) until the next module's does, for that module in phase
// "backward" (so the reduction of a module's output gradient, which runs once that gradient
// has arrived, counts for the module that produced the output); anything else (the loss, the optimizer step) for the
// root, "" in phase "other". An implicit redistribute is an input an op's sharding rule moved with a collective though
// no plan, style or explicit redistribute asked for it (dtensor/sharding_strategy.h): reported with the module and
// phase, or with ImplicitRedistributes::kRaise a ValueError before the op moves anything.
//
// The counts are the process's CollectiveCounter's: one CommDebugMode at a time, and no
// collectives of other threads meanwhile. Module hooks cannot be removed, so a finished
// CommDebugMode leaves its hooks on the modules, dormant. They only observe (HookRole): a
// module that reads a child's parameters itself while the child has no acting hooks
// (Transformer's fused loss) keeps doing so while watched, its collectives then counting
// for that module.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/collective_counter.h"
#include "dtensor/sharding_strategy.h"
#include "nn/module.h"

namespace dtr::nn {

enum class ImplicitRedistributes : uint8_t { kReport, kRaise };

// One row of the table: a collective kind a module issued in a phase.
struct CommDebugRow {
  std::string module;  // "" for the root
  std::string phase;   // "forward", "backward" or "other"
  CollectiveKind kind;
  int64_t calls = 0;
  int64_t bytes = 0;  // CollectiveCounter's bytes (nccl-tests' size)
};

// An implicit redistribute and where it happened.
struct CommDebugCause {
  std::string module;
  std::string phase;
  ImplicitRedistribute move;
};

class CommDebugMode {
 public:
  explicit CommDebugMode(Module& root, ImplicitRedistributes implicit = ImplicitRedistributes::kReport);
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  // Every (module, phase, kind) seen so far, in the order first seen.
  std::vector<CommDebugRow> rows() const;
  // The implicit redistributes seen so far, in order (kReport).
  std::vector<CommDebugCause> causes() const;
  // Calls of one kind in one module and phase (0 when none).
  int64_t calls(const std::string& module, const std::string& phase, CollectiveKind kind) const;
  // The rows and causes as a text table.
  std::string table() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
  std::optional<ImplicitRedistributeWatch> watch_;
};

}  // namespace dtr::nn
