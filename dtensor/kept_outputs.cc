#include "dtensor/kept_outputs.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"

namespace dtr {
namespace {

thread_local std::pair<KeptOutputs*, KeptOutputs::Mode> t_store{nullptr, KeptOutputs::Mode::kRecord};

}  // namespace

KeptOutputs::KeptOutputs(std::vector<std::string> ops, int64_t products_every)
    : ops_(std::move(ops)), products_every_(products_every) {
  DTR_CHECK(products_every >= 1, ValueError,
            "selective checkpointing: products_every {} must be at least 1 (1 keeps every product, 2 every second)",
            products_every);
  for (const std::string& op : ops_) {
    DTR_CHECK(std::find(kKeepableOps.begin(), kKeepableOps.end(), op) != kKeepableOps.end(), ValueError,
              "selective checkpointing: the policy names '{}', whose outputs cannot be kept; it keeps those of {}", op,
              fmt::join(kKeepableOps, ", "));
  }
}

KeptOutputs::Scope::Scope(KeptOutputs* store, Mode mode) : previous_(t_store) { t_store = {store, mode}; }

KeptOutputs::Scope::~Scope() { t_store = previous_; }

bool KeptOutputs::in_scope() { return t_store.first != nullptr; }

bool KeptOutputs::keeps(std::string_view op, Mode mode) {
  if (std::find(ops_.begin(), ops_.end(), op) == ops_.end()) return false;
  if (op != "matmul" && op != "bmm" && op != "linear") return true;
  return products_seen_[static_cast<size_t>(mode)]++ % products_every_ == 0;
}

std::vector<Tensor> kept_or_computed(std::string_view op, const std::function<std::vector<Tensor>()>& compute) {
  auto [store, mode] = t_store;
  if (store == nullptr || !store->keeps(op, mode)) return compute();
  if (mode == KeptOutputs::Mode::kRecord) {
    std::vector<Tensor> out = compute();
    store->kept_.emplace_back(std::string(op), out);
    return out;
  }
  DTR_INTERNAL_ASSERT(!store->kept_.empty() && store->kept_.front().first == op,
                      "selective checkpointing: the recompute calls {} where the forward called {}", op,
                      store->kept_.empty() ? std::string("nothing more") : store->kept_.front().first);
  std::vector<Tensor> out = std::move(store->kept_.front().second);
  store->kept_.pop_front();
  return out;
}

}  // namespace dtr
