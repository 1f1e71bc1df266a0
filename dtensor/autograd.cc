#include "dtensor/autograd.h"

#include <atomic>
#include <map>
#include <queue>
#include <unordered_map>
#include <utility>

#include "core/trace.h"
#include "dtensor/internal/dtensor_impl.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"

namespace dtr {
namespace {

thread_local bool t_grad_mode = true;
// backward_runs_once() of the backward function running on this thread.
thread_local bool t_runs_once = false;
// The callbacks queued for each backward running on this thread, innermost last.
thread_local std::vector<std::vector<std::function<void()>>> t_callbacks;
std::atomic<uint64_t> g_next_sequence_nr{0};

// A zero gradient for an output that received none.
DTensor zeros_for(const DTensorSpec& spec) {
  DTensorSpec s = spec.with_placements(reduced_placements(spec.placements()));
  return DTensor(zeros(s.local_shape(), s.dtype(), s.mesh().device()), s);
}

// The node into which gradients of a leaf flow: accumulates them into leaf.grad. It serves
// every op that uses the leaf, so it belongs to no trace region.
std::shared_ptr<Node> grad_accumulator(const DTensor& leaf) {
  DTensor::Impl& impl = AutogradAccess::impl(leaf);
  if (auto existing = impl.grad_accumulator.lock()) return existing;
  std::weak_ptr<DTensor::Impl> weak = AutogradAccess::shared(leaf);
  const trace::Region no_region("");
  auto node = std::make_shared<Node>(
      "AccumulateGrad",
      [weak](const std::vector<DTensor>& grads) -> std::vector<DTensor> {
        auto shared = weak.lock();
        if (!shared) return {};  // the leaf is gone: nobody can read its gradient
        DTensor leaf = AutogradAccess::wrap(shared);
        DTensor g = grads[0];
        for (auto& [id, hook] : shared->hooks) {
          DTensor replaced = hook(g);
          if (replaced.defined()) g = replaced;
        }
        const Placements target = shared->grad_placements.value_or(leaf.placements());
        {
          NoGradGuard no_grad;
          if (g.placements() != target) g = g.redistribute(target);
          // A grad set elsewhere (a reduced one) accumulates at the grad placements too.
          if (shared->grad.defined() && shared->grad.placements() != target) {
            shared->grad = shared->grad.redistribute(target);
          }
          shared->grad = shared->grad.defined() ? accumulate_gradients(shared->grad, g) : g.detach();
        }
        for (auto& hook : shared->post_accumulate_hooks) hook(leaf);
        return {};
      },
      std::vector<Edge>{}, std::vector<DTensorSpec>{leaf.spec()}, SavedState::kKeep);
  impl.grad_accumulator = node;
  return node;
}

// Sets backward_runs_once() for one backward function's run; the enclosing function's value
// (a recompute's backward runs inside one) comes back after it, exceptions included.
class RunsOnceScope {
 public:
  explicit RunsOnceScope(bool once) : outer_(std::exchange(t_runs_once, once)) {}
  ~RunsOnceScope() { t_runs_once = outer_; }
  RunsOnceScope(const RunsOnceScope&) = delete;
  RunsOnceScope& operator=(const RunsOnceScope&) = delete;

 private:
  bool outer_;
};

// The edge a gradient for `t` takes: its grad_fn, its accumulator, or none.
Edge edge_of(const DTensor& t) {
  DTensor::Impl& impl = AutogradAccess::impl(t);
  if (impl.grad_fn) return {impl.grad_fn, impl.output_nr};
  if (impl.requires_grad) return {grad_accumulator(t), 0};
  return {};
}

}  // namespace

Node::Node(std::string name, BackwardFn backward, std::vector<Edge> next_edges, std::vector<DTensorSpec> output_specs,
           SavedState saved)
    : name_(std::move(name)),
      backward_(std::move(backward)),
      next_edges_(std::move(next_edges)),
      output_specs_(std::move(output_specs)),
      saved_(saved),
      sequence_nr_(g_next_sequence_nr++),
      region_(trace::current_region()) {}

std::vector<DTensor> Node::apply(std::vector<DTensor> grad_outputs) {
  DTR_CHECK(backward_ != nullptr, ValueError,
            "backward: {} was already run and its saved tensors freed; to backpropagate through a graph twice, "
            "pass RetainGraph::kYes to the first backward()",
            name_);
  for (size_t i = 0; i < grad_outputs.size(); ++i) {
    if (!grad_outputs[i].defined()) grad_outputs[i] = zeros_for(output_specs_[i]);
  }
  for (auto& [id, hook] : pre_hooks_) {
    DTensor replaced = hook.second(grad_outputs[hook.first]);
    if (replaced.defined()) grad_outputs[hook.first] = replaced;
  }
  return backward_(std::move(grad_outputs));
}

void Node::add_pre_hook(int id, size_t output_nr, std::function<DTensor(const DTensor&)> hook) {
  pre_hooks_.emplace(id, std::make_pair(output_nr, std::move(hook)));
}

bool grad_mode_enabled() { return t_grad_mode; }

NoGradGuard::NoGradGuard() : previous_(t_grad_mode) { t_grad_mode = false; }
NoGradGuard::~NoGradGuard() { t_grad_mode = previous_; }

EnableGradGuard::EnableGradGuard() : previous_(t_grad_mode) { t_grad_mode = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_mode = previous_; }

bool needs_grad(std::span<const DTensor> inputs) {
  if (!grad_mode_enabled()) return false;
  for (const DTensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

void record(std::string name, std::span<const DTensor> inputs, std::span<DTensor> outputs, BackwardFn backward) {
  if (!needs_grad(inputs)) return;
  std::vector<Edge> edges;
  for (const DTensor& t : inputs) edges.push_back(t.defined() ? edge_of(t) : Edge{});
  std::vector<DTensorSpec> specs;
  for (const DTensor& o : outputs) specs.push_back(o.spec());
  auto node = std::make_shared<Node>(std::move(name), std::move(backward), std::move(edges), std::move(specs));
  for (size_t i = 0; i < outputs.size(); ++i) {
    DTensor::Impl& impl = AutogradAccess::impl(outputs[i]);
    impl.grad_fn = node;
    impl.output_nr = i;
    impl.requires_grad = true;
  }
}

DTensor accumulate_gradients(const DTensor& a, const DTensor& b) {
  NoGradGuard no_grad;
  DTR_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(), ValueError,
            "backward: gradients of shapes {} {} and {} {} meet at one tensor; an op's backward returned a "
            "gradient of the wrong shape or dtype",
            a.shape(), dtype_name(a.dtype()), b.shape(), dtype_name(b.dtype()));
  if (deterministic_block_tokens() > 0 && (a.spec().has_partial() || b.spec().has_partial())) {
    // Under --deterministic (kernels/block_reduce.h) the two gradients of a tied weight are
    // reduced apart and then added: the tree of each, whichever rank holds which terms.
    // Adding the ranks' terms first would make the sum's order the layout's.
    const Placements reduced = reduced_placements(a.placements());
    const DTensor ra = a.redistribute(reduced), rb = b.redistribute(reduced);
    return DTensor(add(ra.to_local(), rb.to_local()), ra.spec());
  }
  const DTensor moved = b.placements() == a.placements() ? b : b.redistribute(a.placements());
  return DTensor(add(a.to_local(), moved.to_local()), a.spec());
}

void add_unreduced(DTensor& left, const DTensor& right) {
  DTR_CHECK(left.spec() == right.spec(), ValueError, "add_unreduced: {} and {} differ in spec", left.to_string(),
            right.to_string());
  left = DTensor(add(left.to_local(), right.to_local()), left.spec());
}

void add_unreduced_each(std::vector<DTensor>& left, const std::vector<DTensor>& right) {
  DTR_CHECK(left.size() == right.size(), ValueError, "add_unreduced_each: {} and {} tensors", left.size(),
            right.size());
  for (size_t i = 0; i < left.size(); ++i) add_unreduced(left[i], right[i]);
}

bool backward_runs_once() { return t_runs_once; }

bool in_nested_backward() { return t_callbacks.size() > 1; }

void queue_callback(std::function<void()> callback) {
  DTR_CHECK(!t_callbacks.empty(), ValueError, "queue_callback: no backward is running on this thread");
  t_callbacks.front().push_back(std::move(callback));
}

namespace {

// Runs the nodes reachable from the roots (run_backward without its callbacks).
void run_graph(std::vector<DTensor> roots, std::vector<DTensor> gradients, RetainGraph retain_graph) {
  // Seed the roots' gradients.
  struct Pending {
    std::vector<DTensor> grads;
    int dependencies = 0;
  };
  std::unordered_map<Node*, Pending> pending;
  std::vector<std::pair<Edge, DTensor>> seeds;
  for (size_t i = 0; i < roots.size(); ++i) {
    const DTensor& root = roots[i];
    DTR_CHECK(root.requires_grad(), ValueError,
              "backward: {} does not require grad and has no grad_fn: nothing to backpropagate", root.to_string());
    DTensor g;
    if (!gradients.empty()) {
      g = gradients[i];
      DTR_CHECK(g.shape() == root.shape(), ValueError, "backward: gradient of shape {} for a root of shape {}",
                g.shape(), root.shape());
    } else {
      DTR_CHECK(root.numel() == 1, ValueError,
                "backward: {} has {} elements; backward() without a gradient needs a one-element tensor (a loss)",
                root.to_string(), root.numel());
      // d(value)/d(term) is 1 for Partial(sum) and 1/n for Partial(avg); the gradient of a
      // Partial root is Replicate (every term gets it).
      double seed = 1.0;
      Placements p = root.placements();
      for (size_t m = 0; m < p.size(); ++m) {
        if (!p[m].is_partial()) continue;
        DTR_CHECK(is_linear(p[m].reduce_op()), NotImplementedError,
                  "backward: the root {} is Partial({}); reduce it first (redistribute to Replicate)", root.to_string(),
                  reduce_op_name(p[m].reduce_op()));
        if (p[m].reduce_op() == ReduceOp::kAvg) seed /= static_cast<double>(root.mesh().size(static_cast<int64_t>(m)));
        p[m] = Replicate();
      }
      DTensorSpec spec = root.spec().with_placements(p);
      g = DTensor(full(spec.local_shape(), seed, root.dtype(), root.mesh().device()), spec);
    }
    seeds.emplace_back(edge_of(root), g);
  }
  roots.clear();
  gradients.clear();
  // Count, for every node reachable from the roots, the edges that lead into it.
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (auto& [edge, g] : seeds) {
    if (edge.node && !seen[edge.node.get()]) {
      seen[edge.node.get()] = true;
      stack.push_back(edge.node.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.node) continue;
      pending[e.node.get()].dependencies++;
      if (!seen[e.node.get()]) {
        seen[e.node.get()] = true;
        stack.push_back(e.node.get());
      }
    }
  }
  auto deliver = [&](const Edge& edge, const DTensor& g) {
    Pending& p = pending[edge.node.get()];
    if (p.grads.empty()) p.grads.resize(edge.node->num_outputs());
    DTensor& slot = p.grads[edge.input_nr];
    slot = slot.defined() ? accumulate_gradients(slot, g) : g;
  };
  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr() < b->sequence_nr();
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later_first)> ready(
      later_first);
  for (auto& [edge, g] : seeds) {
    if (!edge.node) continue;
    deliver(edge, g);
    g = DTensor();  // the node's pending gradients hold it now, until the node runs
  }
  for (auto& [edge, g] : seeds) {
    if (edge.node && pending[edge.node.get()].dependencies == 0) {
      pending[edge.node.get()].dependencies = -1;  // queued
      ready.push(edge.node);
    }
  }
  NoGradGuard no_grad;  // backward functions build no graph (no double backward)
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<DTensor> grads = std::move(pending[node.get()].grads);
    pending.erase(node.get());
    grads.resize(node->num_outputs());  // outputs that got no gradient are zero-filled by apply
    std::vector<DTensor> input_grads;
    {
      const trace::Region region(node->region());
      const trace::Span span(node->name(), trace::Category::kAutograd);
      const RunsOnceScope runs_once(retain_graph == RetainGraph::kNo && node->releases_saved());
      try {
        input_grads = node->apply(std::move(grads));
      } catch (...) {
        // It may have let go of saved tensors already (backward_runs_once): a second run
        // must meet apply's "already run" error, not a half-released function.
        if (retain_graph == RetainGraph::kNo) node->release();
        throw;
      }
    }
    if (retain_graph == RetainGraph::kNo) node->release();
    const auto& edges = node->next_edges();
    DTR_INTERNAL_ASSERT(input_grads.empty() || input_grads.size() == edges.size(),
                        "{} returned {} gradients for {} inputs", node->name(), input_grads.size(), edges.size());
    for (size_t i = 0; i < input_grads.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.node) continue;
      if (input_grads[i].defined()) deliver(e, input_grads[i]);
      Pending& p = pending[e.node.get()];
      if (--p.dependencies == 0) ready.push(e.node);
    }
    for (size_t i = input_grads.size(); i < edges.size(); ++i) {  // a node that returned nothing
      if (edges[i].node && --pending[edges[i].node.get()].dependencies == 0) ready.push(edges[i].node);
    }
  }
}

}  // namespace

void run_backward(std::vector<DTensor> roots, std::vector<DTensor> gradients, RetainGraph retain_graph) {
  DTR_CHECK(gradients.empty() || gradients.size() == roots.size(), ValueError, "backward: {} gradients for {} roots",
            gradients.size(), roots.size());
  struct Frame {  // the callbacks of this backward, dropped if it throws
    Frame() { t_callbacks.emplace_back(); }
    ~Frame() { t_callbacks.pop_back(); }
  };
  std::vector<std::function<void()>> callbacks;
  {
    const Frame frame;
    run_graph(std::move(roots), std::move(gradients), retain_graph);
    callbacks = std::move(t_callbacks.back());
  }
  for (const std::function<void()>& callback : callbacks) callback();
}

}  // namespace dtr
