// Autograd over DTensors: graph nodes, grad mode and the backward engine (PyTorch's
// torch.autograd, reduced to what training needs).
//
// Each differentiable op calls record(): its outputs get a Node whose BackwardFn maps
// output gradients to input gradients with DTensor ops, so gradients follow sharding rules
// too (the weight gradient of S(0) x R is S(1) x S(0) = Partial(sum): data parallelism falls
// out). Nodes run in reverse creation order once all their gradients have arrived; gradients
// that meet are summed (+=), and a leaf's are moved to its grad placements and accumulated
// (+=) there. A node's BackwardFn and what it saved are released as soon as it has run.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtensor/dtensor.h"

namespace dtr {

// Maps the gradients of a node's outputs (all defined: missing ones are zeros) to those
// of its inputs (one per input; undefined where an input gets none). The gradients are
// the function's own (an op's lambda may still take them by const reference): one that
// seeds a backward of its own with them (activation checkpointing's recompute) hands them
// on and they are freed as that backward runs.
using BackwardFn = std::function<std::vector<DTensor>(std::vector<DTensor> grad_outputs)>;

// Where a gradient goes: input `input_nr` of `node`.
struct Edge {
  std::shared_ptr<Node> node;
  size_t input_nr = 0;
};

// Whether a node's backward function (and what it saved) is dropped once it has run
// without RetainGraph::kYes. Leaf accumulators save nothing and serve every backward.
enum class SavedState : uint8_t { kReleaseAfterRun, kKeep };

class Node {
 public:
  Node(std::string name, BackwardFn backward, std::vector<Edge> next_edges, std::vector<DTensorSpec> output_specs,
       SavedState saved = SavedState::kReleaseAfterRun);
  const std::string& name() const { return name_; }
  // One per input of the op (a null node where the input needs no gradient).
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  size_t num_outputs() const { return output_specs_.size(); }
  // Creation order: later nodes run first.
  uint64_t sequence_nr() const { return sequence_nr_; }
  // The trace region its op ran in (core/trace.h); the engine runs the backward in it.
  const char* region() const { return region_; }
  // Runs the backward (zero-filling undefined gradients); ValueError once released.
  std::vector<DTensor> apply(std::vector<DTensor> grad_outputs);
  // Hooks on the gradient of output `output_nr`, run before the backward (tensor hooks
  // on non-leaf tensors, registered through DTensor::register_hook; ids are unique).
  void add_pre_hook(int id, size_t output_nr, std::function<DTensor(const DTensor&)> hook);
  // Removes hook `id` if it is output `output_nr`'s; otherwise does nothing.
  void remove_pre_hook(int id, size_t output_nr) {
    const auto it = pre_hooks_.find(id);
    if (it != pre_hooks_.end() && it->second.first == output_nr) pre_hooks_.erase(it);
  }
  // Whether release() drops the backward function (SavedState::kReleaseAfterRun).
  bool releases_saved() const { return saved_ == SavedState::kReleaseAfterRun; }
  // Drops the backward function and everything it saved (unless SavedState::kKeep).
  void release() {
    if (saved_ == SavedState::kReleaseAfterRun) backward_ = nullptr;
  }

 private:
  std::string name_;
  BackwardFn backward_;
  std::vector<Edge> next_edges_;
  std::vector<DTensorSpec> output_specs_;
  SavedState saved_;
  uint64_t sequence_nr_;
  const char* region_;
  std::map<int, std::pair<size_t, std::function<DTensor(const DTensor&)>>> pre_hooks_;
};

// Whether ops record graphs (on by default; per thread).
bool grad_mode_enabled();

// Turns recording off for its scope (torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Turns recording on for its scope (torch.enable_grad()): a backward function that runs a
// forward of its own (activation checkpointing's recompute) inside the engine, which runs
// backward functions without recording.
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// True when grad mode is on and some input requires grad: the op must call record().
bool needs_grad(std::span<const DTensor> inputs);

// Gives `outputs` a node running `backward`, linked to the inputs, if needs_grad(inputs).
// Ops save their own outputs detached (detach()), so a graph never owns itself.
void record(std::string name, std::span<const DTensor> inputs, std::span<DTensor> outputs, BackwardFn backward);

// Backpropagates from roots with the given gradients (empty: each root holds one element
// and gets a gradient of one; a Partial(avg) root's terms each get 1/n). Each node's saved
// tensors are released once it has run (memory falls during backward) unless
// RetainGraph::kYes. The engine lets go of the roots and gradients once it has seeded the
// roots' nodes: a caller that moves its only handles in frees them as the backward runs
// (a root's node needs its gradient, not the root's values).
void run_backward(std::vector<DTensor> roots, std::vector<DTensor> gradients, RetainGraph retain_graph);

// Whether the backward function running on this thread runs once: the engine drops it, and
// what it saved, when it returns (RetainGraph::kNo). It may then let go of a saved tensor as
// soon as it has read it, so that the tensor is freed before the gradients it has still to
// compute are allocated (a matrix product's input, before its input gradient). False
// outside a backward function, and in one that a retained graph may run again.
bool backward_runs_once();

// Runs `callback` once the backward running on this thread has run its last node
// (PyTorch's Variable._execution_engine.queue_callback): for work that must happen once per
// backward whatever parts of the graph it reached. A backward run inside one of its nodes
// (activation checkpointing's recompute) is part of it: the callback waits for the
// outermost. Callbacks run in the order queued,
// outside the engine (one may run a backward of its own); they are dropped when the
// backward throws. ValueError outside a backward.
void queue_callback(std::function<void()> callback);

// Whether the backward running on this thread runs inside a node of another one (activation
// checkpointing's recompute): that outer backward may still have nodes to run.
bool in_nested_backward();

// a + b for gradients meeting in the graph: b is moved to a's placements (no graph).
DTensor accumulate_gradients(const DTensor& a, const DTensor& b);

// left += right on each rank as they lie (one spec; no graph): a Partial's terms stay
// unreduced. A TreeSum's addition: what a rank's tree over micro-batches adds under
// --deterministic (kernels/block_reduce.h).
void add_unreduced(DTensor& left, const DTensor& right);
// add_unreduced(left[i], right[i]) for each i: a TreeSum's addition of lists.
void add_unreduced_each(std::vector<DTensor>& left, const std::vector<DTensor>& right);

}  // namespace dtr
