// ProcessGroup: a set of ranks that run collectives together (c10d's ProcessGroup).
//
// Every call checks its arguments at once (a ValueError or TypeError naming the call,
// the shapes, dtypes and what would be legal), then returns a Work while the collective
// runs in issue order on the group's communication thread (Gloo) or stream (NCCL). The
// caller must leave its tensors alone until wait(). Counts of the "_v" forms are sizes of
// dimension 0 per rank (PyTorch's split sizes), so Shard(0)'s uneven torch.chunk pieces
// map onto them directly. A non-contiguous tensor or a list of tensors moves as one flat
// buffer: one collective, one CollectiveCounter entry. dtypes: float32, float64, bfloat16,
// float16, int32, int64.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/collective.h"
#include "collectives/reduce_op.h"
#include "collectives/store.h"
#include "collectives/work.h"
#include "core/tensor.h"

namespace dtr {

struct GroupOptions {
  // Names the group in errors and in the CollectiveCounter.
  std::string name = "default_pg";
  // World rank of each group rank (empty: the identity).
  std::vector<int> global_ranks;
  // Limit for every collective and rendezvous of the group.
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  // CUDA device of this rank (NCCL only).
  int device_index = 0;
};

class ProcessGroup {
 public:
  // store: shared by the group's ranks (the caller gives each group its own prefix).
  ProcessGroup(std::shared_ptr<Store> store, int rank, int size, GroupOptions options);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Ranks are group-local (0..size-1); global_ranks() maps them to world ranks.
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return options_.name; }
  const std::vector<int>& global_ranks() const { return options_.global_ranks; }
  virtual std::string_view backend_name() const = 0;
  // Where the group's tensors live (CPU for Gloo, this rank's GPU for NCCL): a caller
  // exchanging control messages of its own puts them there.
  virtual Device device() const = 0;
  const std::shared_ptr<Store>& store() const { return store_; }
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_.load()); }
  // Applies to collectives issued from now on; but a Gloo group's ring (reduce_scatter, and
  // all_reduce over 64 KiB) keeps the timeout the group was created with: its bound Gloo
  // buffers take no timeout per call.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ms_ = timeout.count(); }

  // tensor <- op over every rank's tensor, in place.
  Work all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // One all_reduce over several tensors of one dtype (one collective).
  Work all_reduce_coalesced(std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::kSum);

  // output (size * input.numel() elements) <- every rank's input, rank-major. In place
  // when input is output's block for this rank.
  Work all_gather_into_tensor(Tensor& output, const Tensor& input);
  // Uneven: rank r contributes counts[r] rows; output has sum(counts) rows.
  Work all_gather_v(Tensor& output, const Tensor& input, std::vector<int64_t> counts);
  // outputs[i] <- all_gather of inputs[i], for every i, in one collective.
  Work all_gather_into_tensor_coalesced(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs);

  // output <- this rank's block of op over every rank's input (input has size * output.numel()
  // elements). In place when output is input's block for this rank.
  Work reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::kSum);
  // Uneven: input has sum(counts) rows; rank r receives counts[r] of them.
  Work reduce_scatter_v(Tensor& output, const Tensor& input, std::vector<int64_t> counts, ReduceOp op = ReduceOp::kSum);
  Work reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                       ReduceOp op = ReduceOp::kSum);

  // Block j of input (input_splits[j] rows) goes to rank j; block j of output comes from
  // rank j. Empty splits mean equal blocks. output must not overlap input.
  Work all_to_all_single(Tensor& output, const Tensor& input, std::vector<int64_t> output_splits = {},
                         std::vector<int64_t> input_splits = {});

  // tensor <- root's tensor.
  Work broadcast(Tensor& tensor, int root);
  Work barrier();

 protected:
  // Runs c asynchronously after every collective issued before it: c.pack(), the
  // transfer, c.unpack(), then finishes the returned Work.
  virtual Work enqueue(Collective c) = 0;
  // Whether the backend moves tensors on this device.
  virtual bool accepts(Device device) const = 0;
  // The name of the devices it accepts, for errors: "CPU".
  virtual std::string_view accepted_devices() const = 0;

  const GroupOptions& options() const { return options_; }
  // Rendezvous of the group's ranks through the store, before a backend connects: throws
  // DistributedError(kTimeout) naming the ranks that did not come within the timeout.
  void join_ranks();
  // After collective `seq` failed on this rank: asks the store which peers also saw it
  // fail; the others (dead, hung, or elsewhere) are named in the returned sentence.
  std::string diagnose_failure(uint64_t seq);

 private:
  // Checks what every call shares (defined tensors, dtype, device) and fills the
  // description, sequence number and counter entry.
  Collective begin(CollectiveKind kind, std::string_view call, DType dtype, std::string signature,
                   const std::vector<const Tensor*>& tensors);
  Work issue(Collective c);
  std::vector<int> global_of(const std::vector<int>& ranks) const;

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  GroupOptions options_;
  std::atomic<int64_t> timeout_ms_;
  std::atomic<uint64_t> next_seq_{0};
};

}  // namespace dtr
