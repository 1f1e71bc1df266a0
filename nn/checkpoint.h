// Activation checkpointing (PyTorch's composable torch.distributed._composable.checkpoint and
// checkpoint_wrapper's full policy): a checkpointed module's forward keeps none of its
// intermediate activations; backward recomputes the forward from the saved inputs and runs
// its backward then.
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
// Apply it before fully_shard or replicate and before tensor parallelism's styles, as
// torchtitan does: those then see the module as one unit.
#pragma once

#include "nn/module.h"

namespace dtr::nn {

// Checkpoints `module`'s forward from now on. ValueError if it is already checkpointed.
void checkpoint(Module& module);

}  // namespace dtr::nn
