// replicate: data parallelism (PyTorch's DDP) as placement transitions, the baseline that
// fully_shard is measured against.
//
// replicate(module, mesh) makes every parameter of the module a DTensor leaf Replicate on
// the 1-D mesh. Its gradients, Partial because the batch is sharded, are kept unreduced as
// they accumulate and gathered into buckets of about bucket_cap_mb, in reverse
// registration order (roughly the order backward produces them). When every gradient of
// a bucket has arrived, the bucket's Partial -> Replicate move is issued asynchronously
// (one coalesced all-reduce) while backward goes on; when the module's last gradient has
// arrived, every bucket is waited for and each parameter's grad() is the reduced,
// Replicate gradient. So backward issues one all-reduce per bucket, overlapping the rest
// of backward.
//
// Every parameter must get a gradient in each backward (PyTorch's find_unused_parameters
// is not supported): a backward that leaves a bucket unreduced is a ValueError at the next
// forward (its gradients stayed Partial: do not step on them). Gradients are not
// accumulated across backward calls (call zero_grad, or the optimizer's, before each).
#pragma once

#include <memory>
#include <vector>

#include "dtensor/dtensor.h"
#include "nn/module.h"

namespace dtr::nn {

struct ReplicateOptions {
  double bucket_cap_mb = 25;  // PyTorch DDP's default
};

class DDPModule : public ParallelPolicy {
 public:
  // The buckets, each a list of parameter indices into module.parameters().
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }

  // Internal: replicate builds it; use replicate.
  DDPModule(Module& module, const DeviceMesh& mesh, const ReplicateOptions& options);

 private:
  friend DDPModule& replicate(Module&, const DeviceMesh&, const ReplicateOptions&);
  void on_gradient(size_t index);
  void issue(size_t bucket);
  void finish_backward();
  // ValueError when the last backward left a bucket unreduced (a parameter got no gradient).
  void check_last_backward_complete() const;

  std::vector<DTensor*> params_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;              // per parameter
  std::vector<size_t> waiting_;                // per bucket: gradients still to arrive
  std::vector<std::vector<DTensor>> reduced_;  // per bucket: the pending all-reduce's results
};

// Replicates `module`'s parameters over the 1-D `mesh` (see above); the handle lives as
// long as the module. ValueError for a mesh that is not 1-D, a module already replicated
// or sharded, or a parameter that is not Replicate.
DDPModule& replicate(Module& module, const DeviceMesh& mesh, const ReplicateOptions& options = {});

}  // namespace dtr::nn
