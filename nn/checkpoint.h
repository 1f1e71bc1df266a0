// Activation checkpointing (PyTorch's composable torch.distributed._composable.checkpoint and
// checkpoint_wrapper's full policy; torchtitan's per-op selective policy): a checkpointed
// module's forward keeps none of its intermediate activations (full), or only the results of
// the ops its policy names (selective); backward recomputes the forward from the saved
// inputs and runs its backward then.
//
// checkpoint(module) applies in place, as fully_shard does: the module keeps its type,
// children and parameter names, so state dicts and checkpoints are unchanged. Its forward
// runs without recording a graph; its outputs get one node that holds the inputs and the
// seed sequence's state (nn/init.h). That node's backward sets the seed state back (so
// dropout draws the same masks: the recompute is bitwise the forward), runs forward again
// with grad on, from the saved inputs (detached, as leaves), and backpropagates the output
// gradients through it: the parameters' gradients accumulate as usual, the inputs' go on
// to the ops before. The module's forward hooks do not run again (fully_shard's unshard
// happens once before backward, as it would without checkpointing); its children's do.
//
// Selective (CheckpointOptions::keep_ops): the forward also keeps the local results of the
// ops named, the recompute takes them back instead of computing them (dtensor/kept_outputs.h):
// by default attention, every redistribute and the matrix products that hold half the
// products' FLOPs at the fewest bytes, so the recompute runs the cheap ops (norms,
// activations, dropout, adds, views) and half the products' FLOPs (as torchtitan's per-op
// policy, which recomputes every second mm), and never communicates: no collective in
// backward beyond those without checkpointing. A checkpointed module nested in
// a selectively checkpointed one runs as part of it.
//
// Apply it before fully_shard or replicate and before tensor parallelism's styles, as
// torchtitan does: those then see the module as one unit.
#pragma once

#include <string>
#include <vector>

#include "nn/module.h"

namespace dtr::nn {

struct CheckpointOptions {
  // Empty: full checkpointing. Otherwise the ops whose results the forward keeps, each of
  // dtensor/kept_outputs.h's kKeepableOps: selective_policy() keeps all of them.
  std::vector<std::string> keep_ops;
  // Of the matrix products among keep_ops (matmul, bmm, linear), the forward keeps those
  // holding this share of their recompute FLOPs, the most FLOPs per kept byte first
  // (dtensor/kept_outputs.h); the recompute computes the others. 1 keeps every product.
  double product_flops = 1.0;
};

// Selective checkpointing's default policy: scaled_dot_product_attention and redistribute
// (every collective) kept, and the products holding a quarter of the products' FLOPs, the
// most FLOPs per byte first: in a transformer block the feed-forward's down-projection, a
// third of the block's product FLOPs for one [tokens, dim] of the nine its products make.
// The recompute multiplies two thirds of what the forward did.
CheckpointOptions selective_policy();

// Checkpoints `module`'s forward from now on. ValueError if it is already checkpointed, or
// for a policy naming an op whose results cannot be kept.
void checkpoint(Module& module, const CheckpointOptions& options = {});

}  // namespace dtr::nn
