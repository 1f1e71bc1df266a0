#include "dtensor/sharding_strategy.h"

#include <limits>
#include <utility>

#include "dtensor/redistribute_plan.h"

namespace dtr {
namespace {

thread_local int64_t t_promised_collectives = 0;
thread_local std::function<void(const ImplicitRedistribute&)> t_watch;
thread_local int t_declared = 0;

// Reports the moves of `inputs` to `strategy` that communicate to this thread's watch.
void report_implicit_moves(std::string_view op, std::span<const DTensor> inputs, const OpStrategy& strategy) {
  if (!t_watch || t_declared > 0) return;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Placements& want = strategy.inputs[i];
    if (inputs[i].placements() == want) continue;
    ImplicitRedistribute move{std::string(op), describe(inputs[i]), want, {}};
    for (const RedistributeStep& step : plan_redistribute(inputs[i].spec(), want).steps()) {
      if (is_collective(step.op)) move.collectives.push_back(collective_kind(step.op));
    }
    if (!move.collectives.empty()) t_watch(move);
  }
}

// Whether an op may move an input from `from` to `to` to fit a strategy. Shard -> Partial
// is not offered (PyTorch's redistribute_cost bans it too): the pad costs nothing now, but
// leaves every rank a full-size Partial whose reduction costs more than the gather it saved.
bool offered_move(const Placements& from, const Placements& to) {
  for (size_t i = 0; i < from.size() && i < to.size(); ++i) {
    if (from[i].splits_a_dim() && to[i].is_partial()) return false;
  }
  return true;
}

// Bytes all ranks receive to move `spec` to `target`, or -1 if the move is not legal.
// Legality is asked, not caught: an error from planning a legal move is a bug and propagates.
int64_t move_cost(const DTensorSpec& spec, const Placements& target, int64_t* collectives) {
  if (!offered_move(spec.placements(), target) || !can_redistribute(spec, target)) return -1;
  const RedistributePlan plan = plan_redistribute(spec, target);
  int64_t bytes = 0;
  for (int64_t b : plan.total_recv_bytes()) bytes += b;
  *collectives += plan.num_collectives();
  return bytes;
}

}  // namespace

std::string describe(const DTensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{}{} {}", dtype_name(t.dtype()), t.shape(), placements_str(t.placements()));
}

std::vector<OpStrategy> expand_strategies(std::span<const DimStrategy> per_dim, int64_t mesh_ndim) {
  std::vector<OpStrategy> out{OpStrategy{}};
  if (per_dim.empty()) return {};
  out.front().inputs.resize(per_dim.front().inputs.size());
  out.front().outputs.resize(per_dim.front().outputs.size());
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    std::vector<OpStrategy> next;
    for (const OpStrategy& prefix : out) {
      for (const DimStrategy& d : per_dim) {
        OpStrategy s = prefix;
        for (size_t i = 0; i < d.inputs.size(); ++i) s.inputs[i].push_back(d.inputs[i]);
        for (size_t i = 0; i < d.outputs.size(); ++i) s.outputs[i].push_back(d.outputs[i]);
        next.push_back(std::move(s));
      }
    }
    out = std::move(next);
  }
  return out;
}

AppliedStrategy apply_strategy(std::string_view op, std::span<const DTensor> inputs,
                               std::span<const OpStrategy> candidates) {
  std::unique_ptr<trace::Span> span;
  if (trace::enabled(trace::Category::kOp)) span = std::make_unique<trace::Span>(op, trace::Category::kOp);
  std::vector<std::string> described;
  for (const DTensor& t : inputs) described.push_back(describe(t));
  for (const DTensor& t : inputs) {
    DTR_CHECK(t.mesh() == inputs.front().mesh(), ValueError,
              "{}: inputs {} live on different meshes ({} and {}); redistribute them onto one mesh first", op,
              described, inputs.front().mesh().to_string(), t.mesh().to_string());
  }
  int64_t best = -1, best_cost = std::numeric_limits<int64_t>::max(), best_collectives = 0;
  // A candidate the inputs already match wins at once (no planning at all).
  for (size_t c = 0; c < candidates.size() && best < 0; ++c) {
    bool match = true;
    for (size_t i = 0; i < inputs.size() && match; ++i) match = inputs[i].placements() == candidates[c].inputs[i];
    if (match) {
      best = static_cast<int64_t>(c);
      best_cost = 0;
    }
  }
  for (size_t c = 0; c < candidates.size() && best_cost > 0; ++c) {
    int64_t cost = 0, collectives = 0;
    for (size_t i = 0; i < inputs.size() && cost >= 0; ++i) {
      if (inputs[i].placements() == candidates[c].inputs[i]) continue;
      const int64_t move = move_cost(inputs[i].spec(), candidates[c].inputs[i], &collectives);
      cost = move < 0 ? -1 : cost + move;
    }
    if (cost >= 0 && cost < best_cost) {
      best = static_cast<int64_t>(c);
      best_cost = cost;
      best_collectives = collectives;
    }
  }
  if (best < 0) {
    std::vector<std::string> accepted;
    for (const OpStrategy& s : candidates) {
      std::vector<std::string> ins;
      for (const Placements& p : s.inputs) ins.push_back(placements_str(p));
      accepted.push_back(fmt::format("({})", fmt::join(ins, ", ")));
    }
    throw ValueError(fmt::format("{}: no sharding strategy fits the inputs {}; the op accepts input placements {}", op,
                                 described, accepted));
  }
  if (span != nullptr) {
    span->arg("inputs", fmt::format("{}", fmt::join(described, ", ")));
    std::vector<std::string> ins, outs;
    for (const Placements& p : candidates[best].inputs) ins.push_back(placements_str(p));
    for (const Placements& p : candidates[best].outputs) outs.push_back(placements_str(p));
    span->arg("strategy", fmt::format("{} -> {}", fmt::join(ins, ", "), fmt::join(outs, ", ")));
  }
  report_implicit_moves(op, inputs, candidates[best]);
  AppliedStrategy applied{candidates[best], {}, std::move(span)};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Placements& want = applied.strategy.inputs[i];
    applied.inputs.push_back(inputs[i].placements() == want ? inputs[i] : inputs[i].redistribute(want));
  }
  t_promised_collectives += best_collectives;
  return applied;
}

ImplicitRedistributeWatch::ImplicitRedistributeWatch(std::function<void(const ImplicitRedistribute&)> observe)
    : previous_(std::exchange(t_watch, std::move(observe))) {}

ImplicitRedistributeWatch::~ImplicitRedistributeWatch() { t_watch = std::move(previous_); }

DeclaredCollectives::DeclaredCollectives() { ++t_declared; }
DeclaredCollectives::~DeclaredCollectives() { --t_declared; }

int64_t promised_collectives() { return t_promised_collectives; }
void reset_promised_collectives() { t_promised_collectives = 0; }

}  // namespace dtr
