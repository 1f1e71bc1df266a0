#include "kernels/block_reduce.h"

#include <atomic>

#include "core/error.h"
#include "kernels/elementwise.h"

namespace dtr {

namespace {

std::atomic<int64_t> g_block_tokens{0};

// The canonical tree over leaves 0..n-1 (n >= 1) of values that `add(left, right)` sums into
// left. A binary counter: the stack holds complete nodes of strictly falling levels, and a
// new leaf merges with the top while their levels match. What is left at the end are the
// last, incomplete nodes of each level: the tree pads the leaves to a power of two, so each
// is its right neighbour's left child, combined from the top down.
template <class Value, class Leaf, class Add>
Value tree_fold(int64_t n, const Leaf& leaf, const Add& add) {
  std::vector<std::pair<int, Value>> stack;
  for (int64_t i = 0; i < n; ++i) {
    std::pair<int, Value> node{0, leaf(i)};
    while (!stack.empty() && stack.back().first == node.first) {
      std::pair<int, Value> left = std::move(stack.back());
      stack.pop_back();
      add(left.second, node.second);
      node = {left.first + 1, std::move(left.second)};
    }
    stack.push_back(std::move(node));
  }
  Value right = std::move(stack.back().second);
  stack.pop_back();
  while (!stack.empty()) {
    Value left = std::move(stack.back().second);
    stack.pop_back();
    add(left, right);
    right = std::move(left);
  }
  return right;
}

}  // namespace

void set_deterministic_block_tokens(int64_t tokens) {
  DTR_CHECK(tokens >= 0, ValueError, "set_deterministic_block_tokens: {} tokens per block; legal: 0 (off) or more",
            tokens);
  g_block_tokens = tokens;
}

int64_t deterministic_block_tokens() { return g_block_tokens.load(std::memory_order_relaxed); }

std::vector<Tensor> tree_sum(int64_t leaves, const std::function<std::vector<Tensor>(int64_t)>& leaf) {
  DTR_CHECK(leaves > 0, ValueError, "tree_sum: {} leaves; it needs at least one", leaves);
  return tree_fold<std::vector<Tensor>>(leaves, leaf, [](std::vector<Tensor>& left, const std::vector<Tensor>& right) {
    for (size_t i = 0; i < left.size(); ++i) {
      if (left[i].defined()) add_(left[i], right[i]);
    }
  });
}

double tree_sum(std::span<const double> leaves) {
  if (leaves.empty()) return 0.0;
  return tree_fold<double>(
      static_cast<int64_t>(leaves.size()), [&](int64_t i) { return leaves[static_cast<size_t>(i)]; },
      [](double& left, double right) { left += right; });
}

int64_t block_rows(const Shape& shape, int64_t lead, std::string_view op) {
  const int64_t tokens = deterministic_block_tokens();
  if (tokens == 0) return 0;
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
