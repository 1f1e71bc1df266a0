// replicate: data parallelism (PyTorch's DDP) as placement transitions, the baseline that
// fully_shard is measured against.
//
// replicate(module, mesh) makes every parameter of the module a DTensor leaf Replicate on
// the 1-D mesh (DDP x TP: a parameter parallelize_module placed on mesh["tp"] of the same
// root becomes a leaf on the (dp, tp) mesh, Replicate over dp, its tp placement kept, the
// same local piece; the module then computes there, the batch Shard(0) over dp, and each
// bucket all-reduces over dp). Its gradients, Partial because the batch is sharded, are kept unreduced as
// they accumulate and gathered into buckets of about bucket_cap_mb, in reverse
// registration order (roughly the order backward produces them). Buckets are issued in
// that order, each once all its gradients have arrived and every bucket before it is
// issued: its Partial -> Replicate move runs asynchronously (one coalesced all-reduce)
// while backward goes on. At the end of backward a parameter this rank's loss did not
// reach (unused in the step, or on this rank only) gets a zero gradient and its bucket is
// issued, every bucket is waited for, and each parameter's grad() is the reduced,
// Replicate gradient. So every rank issues one all-reduce per bucket, in the same order.
//
// Gradients accumulate across backward calls, as in PyTorch: with gradient sync off
// (set_requires_gradient_sync(false), PyTorch DDP's no_sync()) they stay Partial, unreduced
// (no collective, no memory beyond the gradients); the next synced backward adds its own
// and all-reduces the sum. Under --deterministic they are summed in the canonical tree
// instead (kernels/block_reduce.h), each taken from its leaf as it arrives, unreduced, until
// the synced backward's joins them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/dtensor.h"
#include "kernels/block_reduce.h"
#include "nn/module.h"

namespace dtr::nn {

struct ReplicateOptions {
  double bucket_cap_mb = 25;  // PyTorch DDP's default
};

class DDPModule : public ParallelPolicy {
 public:
  // The buckets, each a list of parameter indices into module.parameters().
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  // Gradient accumulation: with false, backward issues no all-reduce and the gradients stay
  // Partial (each rank's local sum) until a backward with sync on.
  void set_requires_gradient_sync(bool sync) { sync_ = sync; }

  // Internal: replicate builds it; use replicate.
  DDPModule(Module& module, const DeviceMesh& mesh, const ReplicateOptions& options);

 private:
  friend DDPModule& replicate(Module&, const DeviceMesh&, const ReplicateOptions&);
  void on_gradient(size_t index);
  // Issues, in order, the buckets from next_bucket_ on whose gradients have all arrived.
  void issue_ready_buckets();
  // Queued by the first gradient of each synced backward (under --deterministic, of every
  // backward): see above.
  void finish_backward();
  // ValueError when the last backward threw before it finished.
  void check_last_backward_complete() const;
  // Under --deterministic: the parameter's gradient from this backward as a leaf of its tree.
  void push_unsynced(size_t index);
  // Under --deterministic with node lists, at the synced backward's end: see replicate.cc.
  void reduce_unsynced_lists();

  std::string type_name_;
  std::weak_ptr<ParallelPolicy> self_;  // what the end-of-backward callback checks
  std::vector<DTensor*> params_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;  // per parameter
  bool sync_ = true;
  bool in_backward_ = false;                   // a synced backward's gradients are arriving
  std::vector<bool> arrived_;                  // per parameter, in this backward
  std::vector<size_t> waiting_;                // per bucket: gradients still to arrive
  size_t next_bucket_ = 0;                     // the next bucket to issue
  std::vector<std::vector<DTensor>> reduced_;  // per bucket: the pending all-reduce's results
  // Per parameter, under --deterministic: the unsynced micro-batches' gradients, summed in the
  // canonical tree (kernels/block_reduce.h). Between them a parameter's grad() is empty.
  std::vector<std::optional<TreeSum<DTensor>>> unsynced_;
};

// Replicates `module`'s parameters over the 1-D `mesh` (see above); the handle lives as
// long as the module. ValueError for a mesh that is not 1-D, a module already replicated
// or sharded, or a parameter that is neither Replicate nor tensor-parallel on another dim of
// the mesh's root.
DDPModule& replicate(Module& module, const DeviceMesh& mesh, const ReplicateOptions& options = {});

}  // namespace dtr::nn
