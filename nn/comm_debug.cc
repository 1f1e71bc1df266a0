#include "nn/comm_debug.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>

#include "core/error.h"
#include "dtensor/autograd.h"

namespace dtr::nn {

struct CommDebugMode::State {
  ImplicitRedistributes implicit;
  std::vector<CommDebugRow> rows;
  std::vector<CommDebugCause> causes;
  std::vector<std::string> forward;  // the modules whose forward is running, innermost last
  std::string backward;              // the module whose backward started last
  bool in_backward = false;
  std::array<int64_t, std::size(kCollectiveKinds)> seen_calls{}, seen_bytes{};  // the counter at the last flush

  // Where a collective issued now counts.
  std::pair<std::string, std::string> here() const {
    if (!forward.empty()) return {forward.back(), "forward"};
    if (in_backward) return {backward, "backward"};
    return {"", "other"};
  }

  // Counts what the counter saw since the last flush for `here()` (all of it after a reset).
  void flush() {
    const auto [module, phase] = here();
    const CollectiveCounter& counter = collective_counter();
    for (size_t k = 0; k < std::size(kCollectiveKinds); ++k) {
      const int64_t calls = counter.calls(kCollectiveKinds[k]), bytes = counter.bytes(kCollectiveKinds[k]);
      if (calls < seen_calls[k]) seen_calls[k] = seen_bytes[k] = 0;
      if (calls != seen_calls[k]) {
        auto row = std::find_if(rows.begin(), rows.end(), [&](const CommDebugRow& r) {
          return r.module == module && r.phase == phase && r.kind == kCollectiveKinds[k];
        });
        if (row == rows.end()) row = rows.insert(rows.end(), CommDebugRow{module, phase, kCollectiveKinds[k]});
        row->calls += calls - seen_calls[k];
        row->bytes += bytes - seen_bytes[k];
      }
      seen_calls[k] = calls;
      seen_bytes[k] = bytes;
    }
  }

  void on_implicit(const ImplicitRedistribute& move) {
    const auto [module, phase] = here();
    std::vector<std::string_view> kinds;
    for (CollectiveKind k : move.collectives) kinds.push_back(collective_kind_name(k));
    DTR_CHECK(implicit == ImplicitRedistributes::kReport, ValueError,
              "CommDebugMode (strict): {} in module '{}' ({}) would move its input {} to {} implicitly ({}); declare "
              "the layout: a parallel style's Layouts, PrepareModuleInput, or an explicit redistribute",
              move.op, module, phase, move.input, placements_str(move.to), fmt::join(kinds, ", "));
    causes.push_back({module, phase, move});
  }
};

CommDebugMode::CommDebugMode(Module& root, ImplicitRedistributes implicit) : state_(std::make_shared<State>()) {
  state_->implicit = implicit;
  state_->flush();  // what came before is nobody's
  state_->rows.clear();
  const std::weak_ptr<State> weak = state_;
  for (auto& [fqn, module] : root.named_modules()) {
    // First among the pre-hooks, so that the styles' input layouts count for the module.
    module->register_forward_pre_hook(
        [weak, fqn = fqn](Module&, const Values&) -> std::optional<Values> {
          if (const std::shared_ptr<State> s = weak.lock()) {
            s->flush();
            s->forward.push_back(fqn);
          }
          return std::nullopt;
        },
        Prepend::kYes, HookRole::kObserves);
    module->register_forward_hook(
        [weak](Module&, const Values&, const Values&) -> std::optional<Values> {
          if (const std::shared_ptr<State> s = weak.lock()) {
            s->flush();
            s->forward.pop_back();
          }
          return std::nullopt;
        },
        Prepend::kNo, HookRole::kObserves);
    // First among the backward pre-hooks too: what the others issue (fully_shard's gathers)
    // is the module's backward.
    module->register_backward_pre_hook(
        [weak, fqn = fqn](Module&) {
          const std::shared_ptr<State> s = weak.lock();
          if (!s) return;
          s->flush();
          if (!s->in_backward) {
            s->in_backward = true;
            queue_callback([weak] {
              if (const std::shared_ptr<State> alive = weak.lock()) {
                alive->flush();
                alive->in_backward = false;
              }
            });
          }
          s->backward = fqn;
        },
        Prepend::kYes, HookRole::kObserves);
  }
  watch_.emplace([weak](const ImplicitRedistribute& move) {
    if (const std::shared_ptr<State> s = weak.lock()) s->on_implicit(move);
  });
}

CommDebugMode::~CommDebugMode() = default;

std::vector<CommDebugRow> CommDebugMode::rows() const {
  state_->flush();
  return state_->rows;
}

std::vector<CommDebugCause> CommDebugMode::causes() const { return state_->causes; }

int64_t CommDebugMode::calls(const std::string& module, const std::string& phase, CollectiveKind kind) const {
  for (const CommDebugRow& r : rows()) {
    if (r.module == module && r.phase == phase && r.kind == kind) return r.calls;
  }
  return 0;
}

std::string CommDebugMode::table() const {
  std::string out =
      fmt::format("{:<24} {:<9} {:<15} {:>6} {:>12}\n", "module", "phase", "collective", "calls", "bytes");
  for (const CommDebugRow& r : rows()) {
    out += fmt::format("{:<24} {:<9} {:<15} {:>6} {:>12}\n", r.module.empty() ? "(root)" : r.module, r.phase,
                       collective_kind_name(r.kind), r.calls, r.bytes);
  }
  if (state_->causes.empty()) return out + "implicit redistributes: none\n";
  out += "implicit redistributes:\n";
  for (const CommDebugCause& c : state_->causes) {
    std::vector<std::string_view> kinds;
    for (CollectiveKind k : c.move.collectives) kinds.push_back(collective_kind_name(k));
    out += fmt::format("  {} ({}): {} moved {} to {} ({})\n", c.module.empty() ? "(root)" : c.module, c.phase,
                       c.move.op, c.move.input, placements_str(c.move.to), fmt::join(kinds, ", "));
  }
  return out;
}

}  // namespace dtr::nn
