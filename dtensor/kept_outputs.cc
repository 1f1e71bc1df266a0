#include "dtensor/kept_outputs.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"

namespace dtr {
namespace {

thread_local std::pair<KeptOutputs*, KeptOutputs::Mode> t_store{nullptr, KeptOutputs::Mode::kRecord};

bool is_product(std::string_view op) { return op == "matmul" || op == "bmm" || op == "linear"; }

}  // namespace

KeptOutputs::KeptOutputs(std::vector<std::string> ops, double product_flops)
    : ops_(std::move(ops)), product_flops_(product_flops) {
  DTR_CHECK(product_flops >= 0.0 && product_flops <= 1.0, ValueError,
            "selective checkpointing: product_flops {} must be in [0, 1] (the share of the products' recompute "
            "FLOPs whose results are kept: 1 keeps every product, 0 none)",
            product_flops);
  for (const std::string& op : ops_) {
    DTR_CHECK(std::find(kKeepableOps.begin(), kKeepableOps.end(), op) != kKeepableOps.end(), ValueError,
              "selective checkpointing: the policy names '{}', whose outputs cannot be kept; it keeps those of {}", op,
              fmt::join(kKeepableOps, ", "));
  }
}

KeptOutputs::Scope::Scope(KeptOutputs* store, Mode mode) : previous_(t_store) { t_store = {store, mode}; }

KeptOutputs::Scope::~Scope() { t_store = previous_; }

bool KeptOutputs::in_scope() { return t_store.first != nullptr; }

void KeptOutputs::select() {
  std::vector<size_t> products;
  int64_t total = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!is_product(entries_[i].op)) continue;
    products.push_back(i);
    total += entries_[i].flops;
  }
  // FLOPs per byte: a correctly rounded quotient of integers, so equal ratios compare equal.
  auto per_byte = [](const Entry& e) {
    return static_cast<double>(e.flops) / static_cast<double>(std::max<int64_t>(e.bytes, 1));
  };
  std::stable_sort(products.begin(), products.end(), [&](size_t a, size_t b) {
    const Entry &x = entries_[a], &y = entries_[b];
    return per_byte(x) != per_byte(y) ? per_byte(x) > per_byte(y) : x.bytes < y.bytes;
  });
  const double target = product_flops_ * static_cast<double>(total);
  int64_t kept = 0;
  for (size_t i : products) {
    Entry& e = entries_[i];
    if (static_cast<double>(kept) < target) {
      kept += e.flops;
    } else {
      e.kept = false;
      e.outputs.clear();
    }
  }
}

std::vector<Tensor> kept_or_computed(std::string_view op, const std::function<std::vector<Tensor>()>& compute,
                                     int64_t contraction) {
  auto [store, mode] = t_store;
  if (store == nullptr || std::find(store->ops_.begin(), store->ops_.end(), op) == store->ops_.end()) return compute();
  if (mode == KeptOutputs::Mode::kRecord) {
    std::vector<Tensor> out = compute();
    int64_t bytes = 0;
    for (const Tensor& t : out) bytes += static_cast<int64_t>(t.nbytes());
    const int64_t flops = is_product(op) ? 2 * contraction * out.at(0).numel() : 0;
    store->entries_.push_back({.op = std::string(op), .outputs = out, .flops = flops, .bytes = bytes});
    return out;
  }
  auto& entries = store->entries_;
  const size_t next = store->replayed_;
  DTR_INTERNAL_ASSERT(next < entries.size() && entries[next].op == op,
                      "selective checkpointing: the recompute calls {} where the forward called {}", op,
                      next < entries.size() ? entries[next].op : std::string("nothing more"));
  ++store->replayed_;
  return entries[next].kept ? std::move(entries[next].outputs) : compute();
}

}  // namespace dtr
