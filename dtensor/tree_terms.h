// A Partial sum whose terms are nodes of the canonical tree (kernels/block_reduce.h), reduced
// in that tree over the data-parallel group (train --deterministic; docs/deterministic.md).
//
// When a rank's share of a step's batch is not one node of the tree (6 sequences per rank on
// 3 ranks: rank 1's [6, 12) is the nodes [6, 8) and [8, 12), and the tree's node [4, 8)
// straddles ranks 0 and 1), no sum a rank can form is one term of the tree: each rank keeps
// the nodes covering its share apart (at most 2 log2(share) + 1 of them, TreeSum::take_nodes)
// and the reduction combines every rank's nodes in the order of their blocks, as one rank
// holding the whole batch combines them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dtensor/dtensor.h"
#include "kernels/block_reduce.h"

namespace dtr {

// One node of this rank's share: its tensors (one per reduced tensor, in one order on every
// node and rank).
struct TreeTerm {
  TreeNode node;
  std::vector<DTensor> values;
};

// The sums over the data-parallel ranks of `terms`, this rank's nodes in order of their
// blocks: every value Partial(sum) over the same contiguous mesh dims (the data-parallel
// ones; other dims keep their placements), one spec per tensor on every node. Member k of
// those dims' group (row-major) holds the nodes covering blocks [k stride, (k + 1) stride),
// so every rank knows every member's nodes. Each tensor's sum is laid out as `targets[i]`
// (Replicate or Shard over the reduced dims). Per mesh, dims and dtype, in exchanges of at
// most 8 MiB of float32 (their buffers hold every node's copy), one all_to_all carries every
// member's nodes' part of the elements to its owner (K nodes at most: K times the bytes of a
// ring reduce-scatter), which pushes them into a TreeSum in order of their blocks, then one
// all_gather of the parts: (K + 1)(n - 1)/n of the tensors' bytes through each rank.
// Collective over the group; ValueError when a rank's nodes are not the ones its share
// covers.
std::vector<DTensor> reduce_tree_terms(const std::vector<TreeTerm>& terms, int64_t stride,
                                       std::span<const Placements> targets);

}  // namespace dtr
