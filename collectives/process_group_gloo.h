// ProcessGroupGloo: collectives on CPU tensors over Gloo's TCP transport.
//
// Construction is collective: every rank of the group builds it, and it returns once all
// have met through the store and connected a full mesh (or throws a DistributedError
// naming the ranks that never came). One communication thread per group runs the
// collectives in issue order, so the caller computes while they move; a Work::wait() on
// the next collective while that thread is idle runs it on the waiting thread instead
// (same order, one at a time, no handoff). A failed collective
// (timeout, lost peer) fails its Work with a DistributedError naming the group, the call,
// its sizes and the ranks that did not report the failure; the group is unusable after
// that, like c10d's aborted communicators. Algorithms: Gloo's allgather(v), alltoallv,
// broadcast and barrier; dtr's ring reduce_scatter (internal/ring_reduce_scatter.h);
// all_reduce = that reduce_scatter + Gloo's all-gather (small tensors: gather all, reduce
// locally). Gloo's own allreduce is not used. bfloat16 and float16 reduce in
// float32 (one rounding at the end: exact whenever the float32 sum is), at twice the bytes.
// The first group makes the process ignore SIGPIPE (Gloo's sockets would raise it when a
// peer dies), as Python, and so PyTorch, does.
#pragma once

#include <memory>
#include <string_view>

#include "collectives/process_group.h"

namespace dtr {

class ProcessGroupGloo : public ProcessGroup {
 public:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GroupOptions options);
  // Finishes the collectives already issued (each is bounded by the timeout), then stops.
  ~ProcessGroupGloo() override;

  std::string_view backend_name() const override { return "gloo"; }

 protected:
  Work enqueue(Collective c) override;
  bool accepts(Device device) const override { return device.is_cpu(); }
  std::string_view accepted_devices() const override { return "CPU"; }

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with the Works' run_inline hooks
};

}  // namespace dtr
