// Layout-invariant reductions over a batch (train --deterministic; docs/deterministic.md).
//
// A sum over a batch's tokens rounds by its order, so the same global batch split over one
// rank or two gives different bits: one GEMM over all the tokens, or two over halves added
// by a reduce-scatter. While the mode is on, every such reduction sums fixed blocks (one
// sequence each) on their own and combines them in one canonical tree fixed by the blocks'
// global indices: node (level j, index k) covers blocks [k 2^j, (k + 1) 2^j), the sum of
// its two children (a node with one child is that child). A rank whose blocks are one
// aligned node (2^j of them from a multiple of 2^j) computes that node locally, and the
// ranks' nodes combine in the same tree: at two ranks one addition, which IEEE's
// commutative sum makes the same on either rank.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace dtr {

// Tokens per block (a sequence's length) while the mode is on; 0 turns it off (the default).
void set_deterministic_block_tokens(int64_t tokens);
// 0 when the mode is off.
int64_t deterministic_block_tokens();

// Blocks of every feature contraction while the mode is on (tensor parallelism's sums; 1, the
// default: none). A product over features, K = in features forward or out features for an
// input's gradient, then sums K in `blocks` equal blocks on their own and combines them in the
// canonical tree (the same tree as the batch's, over K's blocks): a tensor-parallel rank
// holding blocks/tp of them (a power of two, aligned) computes its node, and the ranks' nodes
// meet in the tree, so a row-parallel product gives the bits one rank's does.
void set_deterministic_feature_blocks(int64_t blocks);
// 1 when the mode is off or no blocks were asked for.
int64_t deterministic_feature_blocks();

// A node of the canonical tree: blocks [index 2^level, (index + 1) 2^level).
struct TreeNode {
  int level = 0;
  int64_t index = 0;

  int64_t first() const { return index << level; }
  int64_t size() const { return int64_t{1} << level; }
};

// The node of blocks [first, first + size); ValueError when they are none (a size that is not
// a power of two, or a first block that is not a multiple of it).
TreeNode node_of(int64_t first, int64_t size);

// The largest nodes of the canonical tree that cover blocks [first, end), in order: at most
// 2 log2(end - first) + 1 of them (the levels rise while `first`'s alignment allows, then
// fall with what is left). A range that one node covers is that node.
std::vector<TreeNode> covering_nodes(int64_t first, int64_t end);

// Where the running micro-batch sits in its step's global batch (--deterministic, when a step
// runs in more than one micro-batch): sequences [first, first + count) of `total`. Ops that draw by global index
// (dropout) place a tensor whose dim 0 holds `count` sequences there, so a batch split into
// micro-batches draws the masks it draws whole; a mean loss (cross_entropy,
// linear_cross_entropy) divides by `targets`, the whole batch's count of targets, so that the
// micro-batches' losses and gradients are the whole batch's terms, whatever their number.
// total 0: no window (the default); targets 0: the micro-batch's own count. With rank_stride
// > 0 the micro-batch is rank-major: each data-parallel rank's rank_rows rows of it start
// rank_stride sequences after the previous rank's, from `first` on rank 0 (a rank then holds
// one range of the step's batch across its micro-batches).
//
// Rank-major, rank_first is this rank's first sequence: its rank_rows rows are one node of the
// canonical tree (rank_node), where fully_shard and replicate place the micro-batch's
// gradient in their trees. With node_lists the ranks' shares of the step are not one node
// each (a rank_stride that is not a power of two, or an hsdp shard group that is no node):
// the policies reduce each rank's list of nodes over the whole data-parallel group
// (dtensor/node_lists.h) instead of one sum per rank.
struct BatchWindow {
  int64_t first = 0, count = 0, total = 0;
  int64_t targets = 0;
  int64_t rank_stride = 0, rank_rows = 0;
  int64_t rank_first = 0;
  bool node_lists = false;

  // The sequence of the step's batch that row `offset` of the micro-batch is.
  int64_t row(int64_t offset) const {
    return first + (rank_stride > 0 && rank_rows > 0 ? offset / rank_rows * rank_stride + offset % rank_rows : offset);
  }
  // This rank's rows as a node of the tree (rank-major: rank_rows a power of two dividing rank_first).
  TreeNode rank_node() const;
};
void set_batch_window(const BatchWindow& window);
BatchWindow batch_window();

// The canonical tree built node by node, for sums that arrive one at a time (micro-batches'
// gradients), in the order of their blocks. A binary counter: a new node merges with the top
// of the stack while the two are siblings (the top the left child of their parent). From
// block 0 the stack holds complete nodes of strictly falling levels, and finish() combines
// them from the top down (the tree pads the blocks to a power of two, so each is the left
// child of a node whose right child is the rest). From another block (a rank's share of a
// batch) the stack is the largest nodes covering the blocks pushed (covering_nodes), which
// take_nodes() hands over for a reduction that combines them with the other ranks' in the
// tree. `add(left, right)` sums right into left.
template <class Value>
class TreeSum {
 public:
  explicit TreeSum(std::function<void(Value&, const Value&)> add) : add_(std::move(add)) {}
  // Leaf 0, 1, ... in order: the node of level 0 after the last one pushed.
  void push(Value leaf) { push(std::move(leaf), TreeNode{.level = 0, .index = next_}); }
  // The node `at`, whose blocks follow those pushed before it.
  void push(Value value, TreeNode at) {
    if (stack_.empty() && next_ == 0) first_ = next_ = at.first();
    DTR_CHECK(at.first() == next_, ValueError,
              "TreeSum: a node of blocks [{}, {}) pushed after blocks [{}, {}); nodes arrive in the order of their "
              "blocks",
              at.first(), at.first() + at.size(), first_, next_);
    next_ = at.first() + at.size();
    while (!stack_.empty() && stack_.back().first.level == at.level && at.index % 2 == 1) {
      Value left = std::move(stack_.back().second);
      stack_.pop_back();
      add_(left, value);
      value = std::move(left);
      at = TreeNode{.level = at.level + 1, .index = at.index / 2};
    }
    stack_.emplace_back(at, std::move(value));
  }
  bool empty() const { return stack_.empty(); }
  // The root (at least one node pushed, from block 0 unless they merged into one node); the
  // sum is empty after.
  Value finish() {
    DTR_CHECK(first_ == 0 || stack_.size() == 1, ValueError,
              "TreeSum: blocks [{}, {}) are {} nodes, not a tree's root; take_nodes() hands them over", first_, next_,
              stack_.size());
    Value right = std::move(stack_.back().second);
    stack_.pop_back();
    while (!stack_.empty()) {
      Value left = std::move(stack_.back().second);
      stack_.pop_back();
      add_(left, right);
      right = std::move(left);
    }
    first_ = next_ = 0;
    return right;
  }
  // The nodes covering the blocks pushed, in order; the sum is empty after.
  std::vector<std::pair<TreeNode, Value>> take_nodes() {
    first_ = next_ = 0;
    return std::exchange(stack_, {});
  }

 private:
  std::function<void(Value&, const Value&)> add_;
  std::vector<std::pair<TreeNode, Value>> stack_;
  int64_t first_ = 0, next_ = 0;  // the first block pushed, the first block not pushed yet
};

// Pushes a micro-batch's sum into `sum`: at this rank's node when `window` is rank-major
// (BatchWindow::rank_node), else as the next leaf.
template <class Value>
void push_micro_batch(TreeSum<Value>& sum, Value value, const BatchWindow& window) {
  if (window.rank_stride > 0) {
    sum.push(std::move(value), window.rank_node());
  } else {
    sum.push(std::move(value));
  }
}

// TreeSum's addition of lists of tensors: position by position, in place; a position
// undefined on the left stays undefined.
void add_tensors(std::vector<Tensor>& left, const std::vector<Tensor>& right);

// The canonical tree over `leaves` leaves (at least one), each leaf(i) a list of tensors of
// its own (the tree adds into them, position by position; every leaf has the same shapes,
// and a position undefined in one leaf is undefined in all and in the result).
// Holds at most log2(leaves) + 1 partial sums at once.
std::vector<Tensor> tree_sum(int64_t leaves, const std::function<std::vector<Tensor>(int64_t)>& leaf);
// The same tree over numbers (0 for none).
double tree_sum(std::span<const double> leaves);

// The rows of a reduction over the first `lead` dims of a tensor of shape `shape`, flattened,
// that one block holds while the mode is on: one sequence. A tensor of three or more dims is
// [sequences, ...] (its dim-0 entries are the blocks), a 2-D one [tokens, features] (blocks
// of deterministic_block_tokens() rows). ValueError naming `op` when the rows do not split
// into whole blocks. 0 when the mode is off or `lead` is 0 (no rows summed).
int64_t block_rows(const Shape& shape, int64_t lead, std::string_view op);

// The reduction `reduce(first_row, rows)` computes over a range of the `rows` rows: one call
// when block_rows is 0, else one per block of block_rows rows, combined by tree_sum.
std::vector<Tensor> reduce_rows(int64_t rows, int64_t block_rows,
                                const std::function<std::vector<Tensor>(int64_t, int64_t)>& reduce);

}  // namespace dtr
