// DTensor's shared state: what a DTensor handle points to (data, spec, pending move, and
// autograd metadata). Only dtensor.cc and autograd.cc see it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "dtensor/dtensor.h"

namespace dtr {

class Node;

struct DTensor::Impl {
  Tensor local;
  std::optional<DTensorSpec> spec;
  std::shared_ptr<PendingRedistribute> pending;  // set while an async redistribute runs
  size_t pending_index = 0;

  // Autograd: a leaf that requires grad, or an op output with a grad_fn.
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;
  size_t output_nr = 0;
  DTensor grad;
  std::optional<Placements> grad_placements;
  std::map<int, std::function<DTensor(const DTensor&)>> hooks;
  // Hooks registered on an op output: the node and output they sit on (an in-place op may
  // have given the tensor another grad_fn since).
  std::map<int, std::pair<std::weak_ptr<Node>, size_t>> node_hooks;
  std::vector<std::function<void(const DTensor&)>> post_accumulate_hooks;
  std::weak_ptr<Node> grad_accumulator;  // the node gradients of this leaf flow into
};

// The friend through which autograd.cc reaches a DTensor's state.
struct AutogradAccess {
  static DTensor::Impl& impl(const DTensor& t) { return t.impl(); }
  static std::shared_ptr<DTensor::Impl> shared(const DTensor& t) { return t.impl_; }
  static DTensor wrap(std::shared_ptr<DTensor::Impl> impl) { return DTensor(std::move(impl)); }
};

}  // namespace dtr
