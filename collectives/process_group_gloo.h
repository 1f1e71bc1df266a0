// ProcessGroupGloo: collectives on CPU tensors over Gloo's TCP transport.
//
// One thread per group runs the collectives in issue order, so the caller computes while
// they move; a Work::wait() on the next one while that thread is idle runs it on the waiting
// thread instead (same order, no handoff). A failed collective (timeout, lost peer) fails its
// Work with a DistributedError naming the group, the call, its sizes and the silent ranks;
// the group is unusable after that, like c10d's aborted communicators. reduce_scatter and
// all_reduce are dtr's ring (internal/ring_reduce_scatter.h), except that an all_reduce whose
// ranks' tensors total at most 64 KiB is gathered whole and reduced locally; the other calls
// are Gloo's. bfloat16 and float16 reduce in float32 and are rounded once at the end.
#pragma once

#include <memory>
#include <string_view>

#include "collectives/process_group.h"

namespace dtr {

class ProcessGroupGloo : public ProcessGroup {
 public:
  // Collective: returns once every rank has met through the store and connected a full
  // mesh (else a DistributedError naming the ranks that never came). The first group makes
  // the process ignore SIGPIPE (Gloo's sockets would raise it when a peer dies), as Python,
  // and so PyTorch, does.
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, GroupOptions options);
  // Finishes the collectives already issued (each is bounded by the timeout), then stops.
  ~ProcessGroupGloo() override;

  std::string_view backend_name() const override { return "gloo"; }
  Device device() const override { return kCPU; }

 protected:
  Work enqueue(Collective c) override;
  bool accepts(Device device) const override { return device.is_cpu(); }
  std::string_view accepted_devices() const override { return "CPU"; }

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with the Works' run_inline hooks
};

}  // namespace dtr
