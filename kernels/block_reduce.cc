#include "kernels/block_reduce.h"

#include <atomic>
#include <bit>
#include <mutex>

#include "core/error.h"
#include "kernels/elementwise.h"

namespace dtr {

namespace {

std::atomic<int64_t> g_block_tokens{0};
std::atomic<int64_t> g_feature_blocks{1};
std::mutex g_window_mutex;
BatchWindow g_window;

}  // namespace

void set_deterministic_block_tokens(int64_t tokens) {
  DTR_CHECK(tokens >= 0, ValueError, "set_deterministic_block_tokens: {} tokens per block; legal: 0 (off) or more",
            tokens);
  g_block_tokens = tokens;
}

int64_t deterministic_block_tokens() { return g_block_tokens.load(std::memory_order_relaxed); }

void set_deterministic_feature_blocks(int64_t blocks) {
  DTR_CHECK(blocks >= 1, ValueError, "set_deterministic_feature_blocks: {} blocks; legal: 1 (none) or more", blocks);
  g_feature_blocks = blocks;
}

int64_t deterministic_feature_blocks() {
  return deterministic_block_tokens() > 0 ? g_feature_blocks.load(std::memory_order_relaxed) : 1;
}

void set_batch_window(const BatchWindow& window) {
  DTR_CHECK(window.total == 0 || (window.first >= 0 && window.count > 0 &&
                                  (window.rank_stride > 0 || window.first + window.count <= window.total)),
            ValueError, "set_batch_window: sequences [{}, {}) of {}; legal: a non-empty range inside the batch",
            window.first, window.first + window.count, window.total);
  DTR_CHECK(window.targets >= 0 && (window.targets == 0 || window.total > 0), ValueError,
            "set_batch_window: {} targets; legal: 0, or a count with a batch window", window.targets);
  DTR_CHECK(window.rank_stride == 0 ||
                (window.total > 0 && window.rank_rows > 0 && window.count % window.rank_rows == 0 &&
                 window.first + (window.count / window.rank_rows - 1) * window.rank_stride + window.rank_rows <=
                     window.total),
            ValueError,
            "set_batch_window: rank-major rows {} per rank every {} sequences from {} for {} rows of {}; legal: "
            "whole ranks' rows inside the batch",
            window.rank_rows, window.rank_stride, window.first, window.count, window.total);
  const std::lock_guard<std::mutex> lock(g_window_mutex);
  g_window = window;
}

TreeNode node_of(int64_t first, int64_t size) {
  DTR_CHECK(
      size > 0 && std::has_single_bit(static_cast<uint64_t>(size)) && first % size == 0, ValueError,
      "node_of: blocks [{}, {}) are no node of the canonical tree (a power of two of blocks from a multiple of it)",
      first, first + size);
  return {.level = std::countr_zero(static_cast<uint64_t>(size)), .index = first / size};
}

TreeNode BatchWindow::rank_node() const { return node_of(rank_first, rank_rows); }

BatchWindow batch_window() {
  const std::lock_guard<std::mutex> lock(g_window_mutex);
  return g_window;
}

std::vector<TreeNode> covering_nodes(int64_t first, int64_t end) {
  DTR_CHECK(0 <= first && first <= end, ValueError, "covering_nodes: blocks [{}, {}) is no range", first, end);
  std::vector<TreeNode> nodes;
  while (first < end) {
    int level = 0;  // the largest node starting at `first` that ends by `end`
    while (first % (int64_t{2} << level) == 0 && first + (int64_t{2} << level) <= end) ++level;
    nodes.push_back({.level = level, .index = first >> level});
    first += int64_t{1} << level;
  }
  return nodes;
}

void add_tensors(std::vector<Tensor>& left, const std::vector<Tensor>& right) {
  for (size_t i = 0; i < left.size(); ++i) {
    if (left[i].defined()) add_(left[i], right[i]);
  }
}

std::vector<Tensor> tree_sum(int64_t leaves, const std::function<std::vector<Tensor>(int64_t)>& leaf) {
  DTR_CHECK(leaves > 0, ValueError, "tree_sum: {} leaves; it needs at least one", leaves);
  TreeSum<std::vector<Tensor>> sum(add_tensors);
  for (int64_t i = 0; i < leaves; ++i) sum.push(leaf(i));
  return sum.finish();
}

double tree_sum(std::span<const double> leaves) {
  if (leaves.empty()) return 0.0;
  TreeSum<double> sum([](double& left, const double& right) { left += right; });
  for (double v : leaves) sum.push(v);
  return sum.finish();
}

int64_t block_rows(const Shape& shape, int64_t lead, std::string_view op) {
  const int64_t tokens = deterministic_block_tokens();
  if (tokens == 0 || lead == 0) return 0;  // off, or nothing summed over rows
  DTR_CHECK(lead >= 1 && lead <= static_cast<int64_t>(shape.size()), ValueError,
            "{}: a reduction over the first {} dims of a tensor of shape {}", op, lead, shape);
  const int64_t rows = shape_numel(std::span(shape).first(static_cast<size_t>(lead)));
  // [sequences, ...]: a block is one dim-0 entry; [tokens, ...]: deterministic_block_tokens() of them.
  if (rows == 0) return tokens;  // nothing to sum: one (empty) call
  const int64_t block = shape.size() >= 3 ? rows / shape[0] : tokens;
  DTR_CHECK(rows % block == 0, ValueError,
            "{}: --deterministic sums blocks of one sequence ({} tokens), but the {} rows of a reduction over the "
            "first {} dims of shape {} do not split into them",
            op, tokens, rows, lead, shape);
  return block;
}

std::vector<Tensor> reduce_rows(int64_t rows, int64_t block_rows,
                                const std::function<std::vector<Tensor>(int64_t, int64_t)>& reduce) {
  if (block_rows == 0 || rows <= block_rows) return reduce(0, rows);
  return tree_sum(rows / block_rows, [&](int64_t i) { return reduce(i * block_rows, block_rows); });
}

}  // namespace dtr
