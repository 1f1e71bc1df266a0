// A Partial sum whose terms on each rank are a list of nodes of the canonical tree
// (kernels/block_reduce.h), reduced in that tree over the data-parallel group (train
// --deterministic; docs/deterministic.md).
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

// One node of a rank's list: its tensors (one per reduced tensor, in one order on every node
// and rank).
struct NodeTerm {
  TreeNode node;
  std::vector<DTensor> values;
};

// The sums over the data-parallel ranks of their node lists; `nodes` is this rank's, in order
// of their blocks. Every value is Partial(sum) over the same contiguous mesh dims, the
// data-parallel ones (other dims keep their placements), with one spec per tensor on every
// node. Member k of those dims' group (row-major) holds the nodes covering blocks
// [k share, (k + 1) share) of a batch of `blocks` (the group's size times `share`), so every
// rank knows every member's nodes. Each tensor's sum is laid out as `targets[i]` (Replicate
// or Shard over the reduced dims). Per mesh, dims, dtype and kind of target, in exchanges of
// at most 8 MiB of float32 (their buffers hold every node's copy), one all_to_all carries
// every member's nodes' part of the elements to its owner (K nodes at most: K times the
// bytes of a ring reduce-scatter), which pushes them into a TreeSum in order of their
// blocks. Where a target shards the sum over every reduced dim in plain chunks that each
// rank holds within its local tensor (fully_shard's Shard(0)), a member's part is its own
// chunk and that is all: K (n - 1)/n of the tensors' bytes through each rank. Otherwise the
// parts are even splits and one all_gather of them follows: (K + 1)(n - 1)/n.
// Collective over the group. ValueError, before any communication and on every rank alike,
// when the group's size times `share` is not `blocks`; on this rank alone (before any
// communication too) when the tensors' specs differ between nodes, and before a group's
// exchange when its nodes are not the ones its share covers.
std::vector<DTensor> reduce_node_lists(const std::vector<NodeTerm>& nodes, int64_t share, int64_t blocks,
                                       std::span<const Placements> targets);

}  // namespace dtr
