// fully_shard: FSDP (PyTorch's FSDP2) as placement transitions, built from Module's hooks.
//
// fully_shard(module, mesh) makes the module's parameters (those not already owned by a
// fully_shard call on a submodule: call it bottom-up, each block and then the root) one
// group of DTensor leaves Shard(0) on a 1-D mesh, or (Replicate, Shard(0)) on a 2-D one
// (HSDP: replicated over mesh dim 0, sharded over dim 1, or over the dim named by
// shard_mesh_dim): each rank keeps its chunk, as
// torch.chunk cuts it (uneven and empty shards are fine). The optimizer, clip_grad_norm_
// and state_dict() see these sharded leaves under the parameters' own names.
//
// Around each call of the module:
//   pre-forward   the group's sharded leaves move to Replicate in one coalesced
//                 redistribute (one all-gather) and the module's slots hold the gathered
//                 tensors while its forward runs;
//   post-forward  the slots get the sharded leaves back; with reshard_after_forward the
//                 gathered storage is released (the tensors autograd saved keep their
//                 identity, without their bytes);
//   pre-backward  (the first gradient of the module's outputs) released storage is
//                 gathered again, in place;
//   backward      the gradient of the gathered parameters (Partial: the batch is sharded)
//                 goes back through the redistribute's own backward: Partial -> Shard(0),
//                 one coalesced reduce-scatter (HSDP: and one all-reduce), accumulated into
//                 the leaves' grad (none while gradient sync is off); it is issued
//                 asynchronously and runs while the next group's backward computes;
//   post-backward the gathered tensors are dropped.
// At the end of backward the root reduces, with zero gradients, every group whose forward
// ran but which this rank's loss did not reach, so ranks never issue mismatched collectives
// (a group's forward must run on every rank, as its all-gather is collective).
// FSDP x TP (2-D, as torchtitan): parallelize_module on mesh["tp"] first, then fully_shard
// on mesh["dp"] (or a (replicate, shard) sub-mesh: HSDP x TP) of the same root mesh. A
// tensor-parallel parameter's leaf lives on the tp-first view of the root
// (root.submesh({"tp", "dp"})): placements nest in mesh-dim order, so (tp's placement,
// Shard(0)) there is FSDP's chunk of the rank's tensor-parallel piece, uneven sizes and
// StridedShard included (what PyTorch's _StridedShard and shard_order express). Its gather
// goes to (tp's placement, Replicate), which the module reads on the compute mesh (dp, tp)
// (root.submesh({"dp", "tp"}); the same memory) as (Replicate, tp's placement): the module's
// inputs come on that mesh, the batch Shard(0) over dp (tensor parallelism's styles lay out
// its tp dim), so the loss is the whole batch's and dropout draws by global index, as on one
// rank. Its gradient (Partial over dp: the batch is split) reduce-scatters over dp after
// tensor parallelism's own reductions.
// So every step issues, per group, one all-gather in forward, one more in backward when the
// group was resharded, and one reduce-scatter: nothing bypasses DTensor's placements. A
// group is expected to run forward then backward (a second forward before its backward
// gathers again and links again: correct, at the cost of the collectives); the root's next
// forward drops what a step left gathered without a backward.
//
// Implicit prefetch: each forward records the order in which groups ran; in the next
// iteration a group's pre-forward issues the next group's all-gather asynchronously before
// it computes, and a group's pre-backward that of the group which ran before it in forward.
//
// CPU offload (offload_policy): the sharded leaves live in host memory (pinned under a
// CUDA mesh), so the optimizer steps them, and keeps its state, on the CPU. Each all-gather
// first copies the group's shards to the mesh's device (queued on the compute stream, from
// pinned memory without staging); each reduce-scatter's result is copied back to the host
// when the next group's reduction (or the end of backward) waits for it, so the device
// holds parameters only while gathered. Both copies run on the compute stream (the copy
// out blocks the host; docs/fsdp.md). A copy in reads the pinned shard when it runs: the
// host writes a shard only in the optimizer step, after backward, whose copies to the
// host waited for the compute stream and so for every copy in queued before (write a
// shard by hand only after a backward, or after synchronising the device).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <variant>
#include <vector>

#include "core/trace.h"
#include "dtensor/dtensor.h"
#include "nn/module.h"

namespace dtr::nn {

// The trace category of FSDP's spans: unshard, reshard, prefetch, reduce-scatter, gradient
// sync skipped.
inline const trace::Category kFsdpCategory = trace::define_category("fsdp");

// PyTorch's MixedPrecisionPolicy. The sharded parameters (and so the optimizer's state)
// keep their own dtype; each fully_shard call has its own policy.
struct MixedPrecisionPolicy {
  // The gathered parameters' dtype, so of the all-gather and the module's compute.
  std::optional<DType> param_dtype;
  // The reduce-scatter's dtype (default: the gradients', i.e. param_dtype's); the sharded
  // gradient is cast back to the parameter's dtype.
  std::optional<DType> reduce_dtype;
  // The dtype of the module's floating outputs.
  std::optional<DType> output_dtype;
  // Cast the module's floating inputs to param_dtype.
  bool cast_forward_inputs = true;
};

// PyTorch's CPUOffloadPolicy (see above).
struct CPUOffloadPolicy {
  // Page-lock the host shards under a CUDA mesh, so copies to and from the device are
  // queued without a staging copy (false: pageable memory, staged).
  bool pin_memory = true;
};

struct FullyShardOptions {
  // Release the gathered parameters after forward and gather them again for backward
  // (true: ZeRO-3), keep them through backward (false: ZeRO-2), or keep 1/k of them, sharded
  // over groups of k consecutive ranks of the mesh, so that backward's all-gather stays
  // within k ranks (an int k dividing the mesh size: ZeRO++'s hpZ; the mesh may be a 1-D
  // sub-mesh, e.g. mesh["dp"] of a 2-D one). Unset:
  // true, except for the root (the outermost sharded module to run), whose parameters
  // backward needs first.
  std::optional<std::variant<bool, int>> reshard_after_forward;
  MixedPrecisionPolicy mp_policy;
  // The Shard(d) of each parameter, by its name (relative to the module) and value; unset
  // or nullopt: Shard(0). Parameters with different dims move in one collective per
  // distinct placement.
  std::function<std::optional<Placement>(const std::string& name, const DTensor& param)> shard_placement_fn;
  // HSDP: the name of the mesh dim parameters are sharded over (the other replicates
  // them); empty: the last mesh dim.
  std::string shard_mesh_dim;
  // Unset: the sharded leaves live on the mesh's device.
  std::optional<CPUOffloadPolicy> offload_policy;
};

class FSDPModule;
FSDPModule& fully_shard(Module& module, const DeviceMesh& mesh, const FullyShardOptions& options);

class FSDPModule : public ParallelPolicy {
 public:
  Module& module() { return module_; }
  const DeviceMesh& mesh() const { return mesh_; }
  // The group's parameters by name (relative to the module), in traversal order.
  const std::vector<std::string>& parameter_names() const { return names_; }

  // Bytes of gathered parameters this group holds now (0 once resharded).
  int64_t gathered_bytes() const;

  // Gathers the group's parameters now (Async::kYes: issued, waited for at first use).
  // Outside forward and backward this is the by-hand prefetch of PyTorch's unshard().
  void unshard(Async async = Async::kNo);
  // Releases the gathered parameters' storage (what post-forward does when resharding).
  void reshard();
  // Gradient accumulation: with false, backward issues no reduce-scatter; the gradients of
  // this group and every group under it stay unreduced, a whole (unsharded) gradient per
  // parameter on every rank in reduce_dtype, and the leaves get zeros. The next backward
  // with sync on reduces them together with its own, in its one reduce-scatter.
  void set_requires_gradient_sync(bool sync);
  // The reduced gradient becomes the sum of the ranks' local-loss gradients divided by
  // `factor`, as in PyTorch, where each rank's loss is a mean over its own batch. dtr's
  // default gradient is the global loss's, which equals that sum divided by the number of
  // ranks N; so the gradient is scaled by N / factor (factor 1: the sum, for a loss that the
  // user scales by the global token count, as torchtitan does).
  void set_gradient_divide_factor(double factor);
  // (A bool replaces a rank count given to fully_shard.)
  void set_reshard_after_forward(bool reshard) {
    reshard_after_forward_ = reshard;
    post_forward_mesh_.reset();
  }
  // Keep the gathered parameters after backward (false), between micro-batches: the next
  // forward uses them without a collective. They are not updated by an optimizer step, so
  // call reshard() (or set true again) before one.
  void set_reshard_after_backward(bool reshard) { reshard_after_backward_ = reshard; }
  // Whether the next backwards are the last before an optimizer step (default true; it
  // applies to this group and every group under it, until set again). The reduce-scatters
  // run while backward goes on, each waited for by the next group's reduction; a last
  // backward waits for the final one before it returns. With false the final one may still
  // be in flight when backward returns (the leaf's grad() is pending; reading it waits),
  // overlapping the next micro-batch's forward.
  void set_is_last_backward(bool last);
  // Groups whose all-gather this group's pre-forward (pre-backward) issues, replacing the
  // implicit order.
  void set_modules_to_forward_prefetch(std::vector<FSDPModule*> modules);
  void set_modules_to_backward_prefetch(std::vector<FSDPModule*> modules);

  // Internal: fully_shard builds it; use fully_shard.
  FSDPModule(Module& module, const DeviceMesh& mesh, const FullyShardOptions& options);

 private:
  friend FSDPModule& fully_shard(Module&, const DeviceMesh&, const FullyShardOptions&);
  struct Param;
  struct ReduceState;
  enum class State : uint8_t { kSharded, kUnsharded };

  // The hooks' work; the forward ones return the inputs and outputs cast per mp_policy.
  Values pre_forward(const Values& inputs);
  Values post_forward(const Values& outputs);
  void pre_backward();
  void post_backward();
  // The root's, once at the end of each backward: reduces the groups this rank's loss did
  // not reach, and waits for the reduction in flight on a last backward.
  void finish_backward();
  // The root's: runs, with zero gradients and the latest link first, the backward of each
  // group linked at or after `sequence_nr` whose backward has not run (its reduce-scatter,
  // as on the ranks whose loss reaches it).
  void reduce_unreached_from(uint64_t sequence_nr);
  // Makes the gathered parameters readable: waits for an issued gather, or refills
  // released storage in place.
  void wait_for_unshard();
  // The forward's gather: new (recorded by autograd), or a new graph link to parameters
  // kept from the last backward or released by an earlier forward.
  void start_forward_gather(Async async);
  // At the root's first forward: ValueError for a parameter tied across two groups (each
  // sharded it); then every group under the root drops the original (full) tensors it kept
  // for this check.
  void check_ties_once();
  // Follows leaves that load_state_dict or to() put in the module's slots.
  void adopt_replaced_leaves();
  // Drops every gathered tensor and pending gather: the state after a full backward.
  void reset_to_sharded();
  // The shards on the mesh's device cast to param_dtype, ready for the all-gather (no graph).
  std::vector<DTensor> shards_to_gather() const;
  // Where this group keeps its shards: the host under offload, else the mesh's device.
  Device shard_device() const { return offload_ ? Device(kCPU) : mesh_.device(); }
  // `leaf`'s value as a new leaf on shard_device() (pinned as the policy asks), or `leaf`
  // itself if it is there.
  DTensor to_shard_device(const DTensor& leaf) const;
  // Records gathered's autograd node: its backward is the reduce-scatter into the leaves.
  void link_to_leaves(std::vector<DTensor>& gathered);
  // Points the module's parameter slots at the sharded parameters or the gathered ones.
  void use_params(State state);
  // The root's record of the groups in the order their forwards began.
  std::vector<FSDPModule*>& order();
  enum class Pass : uint8_t { kForward, kBackward };
  // The group whose all-gather this one's implicit prefetch issues in `pass`, or null.
  FSDPModule* next_to_run(Pass pass);
  // The root of the sharded forward open on this thread if this module runs inside it, or
  // null (no forward open, or one that threw: of another model, or of this one, gone).
  FSDPModule* enclosing_root() const;

  Module& module_;
  DeviceMesh mesh_;
  MixedPrecisionPolicy mp_;
  std::optional<CPUOffloadPolicy> offload_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<Param>> params_;
  std::vector<DTensor> originals_;  // the parameters before sharding, until the first forward
  std::optional<bool> reshard_after_forward_;
  std::optional<DeviceMesh> compute_mesh_;       // (dp, tp): where its tensor-parallel parameters are read
  std::optional<DeviceMesh> post_forward_mesh_;  // [N / k, k] for reshard_after_forward = k
  std::vector<DTensor> post_forward_shards_;     // (Replicate, Shard(0)) on it, between forward and backward
  bool reshard_after_backward_ = true;
  State state_ = State::kSharded;
  std::string trace_name_;    // its path in the root ("layers.0"; "root"), for traces
  bool released_ = false;     // gathered tensors exist but their storage is freed
  bool linked_ = false;       // this iteration's graph links the gathered tensors
  bool in_backward_ = false;  // pre_backward ran, post_backward not yet: its gradients are coming
  struct Link {
    bool ran = false;          // its backward has run
    uint64_t sequence_nr = 0;  // its autograd node's
  };
  std::shared_ptr<Link> link_;  // the newest graph link's, until the group resets
  bool is_last_backward_ = true;
  std::vector<DTensor> refill_;  // a pending in-place gather of released storage
  std::optional<std::vector<FSDPModule*>> forward_prefetch_, backward_prefetch_;
  std::shared_ptr<ReduceState> reduce_state_;
  FSDPModule* root_ = nullptr;                   // set at the first forward
  std::vector<FSDPModule*> order_, last_order_;  // the root's: this and the last iteration's
  std::vector<FSDPModule*> ended_;               // the root's: this iteration's groups as their forwards ended
  // The root's: its module and every module under it, as its forward began (enclosing_root's
  // lookup: searching them per module made a forward quadratic in the modules).
  std::unordered_set<const Module*> descendants_;
};

// Shards `module`'s parameters over `mesh` (1-D: FSDP; 2-D: HSDP; see above) and returns its FSDP handle,
// which lives as long as the module. Typed errors: a module already sharded, a parameter
// already sharded (fully_shard on an enclosing module came first: call it bottom-up), a
// parameter that is neither Replicate nor tensor-parallel on other dims of the mesh's root,
// a mesh that is not 1-D or 2-D, or a shard_placement_fn choosing a placement that is not
// Shard(d) of the parameter.
FSDPModule& fully_shard(Module& module, const DeviceMesh& mesh, const FullyShardOptions& options = {});

// Explicit prefetch `depth` groups ahead over `blocks`, the groups under `root` that run one
// after another in forward (a Transformer's blocks): the root's pre-forward issues the
// all-gathers of the first `depth` blocks and its pre-backward (backward begins at the
// root's output) those of the last `depth`; block i's pre-forward those of blocks i+1 to
// i+depth, its pre-backward those of blocks i-1 down to i-depth. Each list is in the order
// the groups will run, as collectives run in the order issued. depth 0 turns prefetch off:
// each all-gather is issued by its own group when it runs. ValueError for a negative depth.
void set_prefetch_depth(FSDPModule& root, const std::vector<FSDPModule*>& blocks, int64_t depth);

// The FSDP handle of a sharded module, or null.
FSDPModule* fsdp_module(Module& module);

}  // namespace dtr::nn
