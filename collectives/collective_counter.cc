#include "collectives/collective_counter.h"

namespace dtr {

void CollectiveCounter::record(CollectiveKind kind, const std::string& group, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveCount& c = counts_[{kind, group}];
  c.kind = kind;
  c.group = group;
  c.calls += 1;
  c.bytes += bytes;
}

int64_t CollectiveCounter::calls(CollectiveKind kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& [key, c] : counts_) total += key.first == kind ? c.calls : 0;
  return total;
}

int64_t CollectiveCounter::bytes(CollectiveKind kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& [key, c] : counts_) total += key.first == kind ? c.bytes : 0;
  return total;
}

std::vector<CollectiveCount> CollectiveCounter::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CollectiveCount> rows;
  for (const auto& [key, c] : counts_) rows.push_back(c);
  return rows;
}

void CollectiveCounter::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  counts_.clear();
  wait_ns_.store(0, std::memory_order_relaxed);
}

CollectiveCounter& collective_counter() {
  static CollectiveCounter counter;
  return counter;
}

int64_t issued_collectives() {
  int64_t total = 0;
  for (const CollectiveCount& row : collective_counter().snapshot()) total += row.calls;
  return total;
}

}  // namespace dtr
