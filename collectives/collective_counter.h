// CollectiveCounter: how many collectives of each kind each group issued, and their bytes.
//
// Every ProcessGroup call records one entry when it is issued (a coalesced call is one
// collective: that is its point). bytes is nccl-tests' "size": the larger of the call's
// buffers on this rank (all_gather: its output; reduce_scatter: its input; all_reduce and
// broadcast: the tensor; all_to_all: its input; barrier: 0). Tests read it to assert that
// an operation issued exactly the collectives it should (DTensor's CommDebugMode idea).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtr {

enum class CollectiveKind : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kBarrier };

constexpr std::string_view collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllToAll: return "all_to_all";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "?";
}

inline constexpr CollectiveKind kCollectiveKinds[] = {CollectiveKind::kAllReduce,     CollectiveKind::kAllGather,
                                                      CollectiveKind::kReduceScatter, CollectiveKind::kAllToAll,
                                                      CollectiveKind::kBroadcast,     CollectiveKind::kBarrier};

// The kind collective_kind_name names, or nullopt.
constexpr std::optional<CollectiveKind> collective_kind_from_name(std::string_view name) {
  for (CollectiveKind kind : kCollectiveKinds) {
    if (collective_kind_name(kind) == name) return kind;
  }
  return std::nullopt;
}

// nccl-tests' bus factor: a collective of `bytes` (the counter's size) on `ranks` ranks moves
// bytes x this through each rank in a ring or pairwise algorithm (all_reduce 2 (n - 1) / n,
// broadcast 1, the others (n - 1) / n), so that the figure compares collectives of
// different kinds: an all_to_all and an all_gather of S move what a ring all_reduce of S does.
constexpr double bus_factor(CollectiveKind kind, int64_t ranks) {
  if (kind == CollectiveKind::kBarrier || ranks < 1) return 0.0;
  if (kind == CollectiveKind::kBroadcast) return 1.0;
  const double share = static_cast<double>(ranks - 1) / static_cast<double>(ranks);
  return kind == CollectiveKind::kAllReduce ? 2.0 * share : share;
}

// One row of the counter: a kind on a group.
struct CollectiveCount {
  CollectiveKind kind;
  std::string group;
  int64_t calls = 0;
  int64_t bytes = 0;
};

class CollectiveCounter {
 public:
  void record(CollectiveKind kind, const std::string& group, int64_t bytes);
  // Totals over every group.
  int64_t calls(CollectiveKind kind) const;
  int64_t bytes(CollectiveKind kind) const;
  // Every (kind, group) seen since the last reset, ordered by kind then group.
  std::vector<CollectiveCount> snapshot() const;
  // Time callers spent in Work::wait (blocked, or running the collective inline), in ns,
  // over every thread: what the collectives cost the code that waited for them.
  void record_wait(int64_t ns) { wait_ns_.fetch_add(ns, std::memory_order_relaxed); }
  int64_t wait_ns() const { return wait_ns_.load(std::memory_order_relaxed); }
  void reset();

 private:
  std::atomic<int64_t> wait_ns_{0};
  mutable std::mutex mutex_;
  std::map<std::pair<CollectiveKind, std::string>, CollectiveCount> counts_;
};

// The process-wide counter every ProcessGroup records into.
CollectiveCounter& collective_counter();

// The collectives collective_counter() saw issued since its last reset: every kind, every group.
int64_t issued_collectives();

}  // namespace dtr
