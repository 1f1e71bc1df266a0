// ProcessGroupNCCL: collectives on CUDA tensors through NCCL.
//
// One communicator per group, from a unique id that group rank 0 publishes in the store.
// Collectives run in issue order on the group's own communication stream, each first
// waiting (an event) for the work queued so far on the caller's current stream (the
// compute stream, where dtr's kernels run). Work::wait() makes the caller's stream wait
// for the collective's completion event, without the host (a barrier's blocks the host);
// Work::synchronize() blocks the host. The communicator is non-blocking: each NCCL call is
// polled until it has settled, within the group's timeout (a peer that never joins fails
// the call). A pending collective keeps its buffers alive until its event completes. A watchdog
// thread polls the events and NCCL's asynchronous error; on an error, or a collective
// running past the timeout, it fails every pending Work with a DistributedError naming the
// group, the collective and the silent peers, and aborts the communicator (ncclCommAbort);
// if a stream had already waited for a failed collective, it prints that error and exits
// the process instead (its result may be in use). The uneven forms are grouped calls, as in
// PyTorch. The communicator has one owner, a handle that aborts it unless a clean shutdown
// finalized it, so a constructor that throws after ncclCommInitRankConfig frees it too.
// Compiled in every build; run where a GPU is.
#pragma once

#include <memory>
#include <string_view>

#include "collectives/process_group.h"

namespace dtr {

class ProcessGroupNCCL : public ProcessGroup {
 public:
  // Throws DistributedError(kBackend) when options.device_index is not a CUDA device here.
  ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size, GroupOptions options);
  // Waits for the issued collectives (each bounded by the timeout), then frees the communicator.
  ~ProcessGroupNCCL() override;

  std::string_view backend_name() const override { return "nccl"; }
  Device device() const override;

 protected:
  // Queues c on the group's stream. Uneven forms: all_gather_v is one ncclBroadcast per
  // rank, reduce_scatter_v one ncclReduce per rank, all_to_all ncclSend/ncclRecv pairs;
  // avg is ncclAvg. Staged outputs are copied back on the communication stream; the
  // watchdog finishes the Work once its event completes.
  Work enqueue(Collective c) override;
  bool accepts(Device device) const override;
  std::string_view accepted_devices() const override { return "CUDA (this rank's device)"; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtr
