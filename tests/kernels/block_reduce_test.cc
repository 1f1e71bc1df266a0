// kernels/block_reduce.h: the canonical tree against a recursive definition written here, on
// numbers whose sum depends on the order, whole and leaf by leaf; the tensor tree adds
// position by position; the row blocks of each shape; the mode's switch; the batch window.
#include "kernels/block_reduce.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernels/fill.h"

namespace dtr {
namespace {

// The tree by its definition: node (j, k) covers [k 2^j, (k + 1) 2^j) of the n leaves, the
// sum of its children, or its one non-empty child.
double node(const std::vector<double>& x, int64_t first, int64_t width) {
  const auto n = static_cast<int64_t>(x.size());
  if (width == 1) return x[static_cast<size_t>(first)];
  const int64_t half = width / 2;
  if (first + half >= n) return node(x, first, half);
  return node(x, first, half) + node(x, first + half, half);
}

double by_definition(const std::vector<double>& x) {
  int64_t width = 1;
  while (width < static_cast<int64_t>(x.size())) width *= 2;
  return node(x, 0, width);
}

// One, then numbers about half of one's last bit (some negative): added to one alone each
// rounds away, added to each other first they count, so the order decides the result.
std::vector<double> awkward(int64_t n) {
  std::vector<double> x{1.0};
  for (int64_t i = 1; i < n; ++i) {
    x.push_back(std::ldexp(1.0 + static_cast<double>(i % 4) / 8.0, -53) * (i % 5 == 4 ? -1.0 : 1.0));
  }
  return x;
}

TEST_CASE("tree_sum combines leaves in the canonical tree, for every count", "[kernels][block_reduce]") {
  for (int64_t n = 1; n <= 40; ++n) {
    INFO("leaves " << n);
    const std::vector<double> x = awkward(n);
    CHECK(tree_sum(std::span<const double>(x)) == by_definition(x));
    // Tensors: each leaf [value, -value] as float64; undefined positions stay undefined.
    const std::vector<Tensor> sums = tree_sum(n, [&](int64_t i) {
      const double v = x[static_cast<size_t>(i)];
      return std::vector<Tensor>{Tensor::from_vector<double>({v, -v}), Tensor()};
    });
    CHECK(sums[0].data_ptr<double>()[0] == by_definition(x));
    CHECK(sums[0].data_ptr<double>()[1] == -by_definition(x));
    CHECK_FALSE(sums[1].defined());
  }
  // The canonical tree is not the left-to-right sum (so a test that finds it cannot pass by
  // accident): on these leaves they differ.
  const std::vector<double> x = awkward(7);
  double left_to_right = 0.0;
  for (double v : x) left_to_right += v;
  CHECK(left_to_right != by_definition(x));
  CHECK(tree_sum(std::span<const double>()) == 0.0);
  CHECK_THROWS_WITH(tree_sum(0, [](int64_t) { return std::vector<Tensor>{}; }), Catch::Contains("tree_sum: 0 leaves"));
}

TEST_CASE("a node of the tree is the tree over its own leaves: a rank's half sums as one rank does",
          "[kernels][block_reduce]") {
  // 8 leaves on one rank, or 4 and 4 on two: the same bits.
  const std::vector<double> x = awkward(8);
  const std::vector<double> left(x.begin(), x.begin() + 4), right(x.begin() + 4, x.end());
  CHECK(tree_sum(std::span<const double>(left)) + tree_sum(std::span<const double>(right)) ==
        tree_sum(std::span<const double>(x)));
}

TEST_CASE("TreeSum builds the same tree leaf by leaf (micro-batches' gradients)", "[kernels][block_reduce]") {
  for (int64_t n = 1; n <= 17; ++n) {
    INFO("leaves " << n);
    const std::vector<double> x = awkward(n);
    TreeSum<double> sum([](double& left, const double& right) { left += right; });
    for (double v : x) sum.push(v);
    CHECK(sum.finish() == by_definition(x));
    CHECK(sum.empty());
  }
}

TEST_CASE("covering_nodes: a range's largest aligned nodes, rising then falling", "[kernels][block_reduce]") {
  auto ranges = [](int64_t first, int64_t end) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const TreeNode& n : covering_nodes(first, end)) out.emplace_back(n.first(), n.first() + n.size());
    return out;
  };
  using R = std::vector<std::pair<int64_t, int64_t>>;
  CHECK(ranges(0, 12) == R{{0, 8}, {8, 12}});
  CHECK(ranges(6, 12) == R{{6, 8}, {8, 12}});  // 12 sequences on 2 ranks: rank 1's share
  CHECK(ranges(0, 6) == R{{0, 4}, {4, 6}});    // and rank 0's
  CHECK(ranges(3, 14) == R{{3, 4}, {4, 8}, {8, 12}, {12, 14}});
  CHECK(ranges(8, 16) == R{{8, 16}});  // one node
  CHECK(ranges(5, 5).empty());
  CHECK(covering_nodes(4, 8).front().level == 2);
  CHECK(node_of(8, 4).level == 2);
  CHECK(node_of(8, 4).index == 2);
  CHECK_THROWS_WITH(node_of(6, 4), Catch::Contains("node_of: blocks [6, 10) are no node of the canonical tree"));
  CHECK_THROWS_WITH(node_of(0, 6), Catch::Contains("node_of: blocks [0, 6) are no node"));
  CHECK(covering_nodes(4, 8).front().index == 1);
  CHECK_THROWS_WITH(covering_nodes(6, 2), Catch::Contains("covering_nodes: blocks [6, 2) is no range"));
}

TEST_CASE("TreeSum takes nodes of any size in order: the micro-batches that cover a batch sum as its leaves do",
          "[kernels][block_reduce]") {
  const auto plus = [](double& left, const double& right) { left += right; };
  for (int64_t n = 1; n <= 24; ++n) {
    const std::vector<double> x = awkward(n);
    // Split [0, n) at every cut c, each side into its covering nodes, each node's leaves summed
    // by the tree: pushed node by node, they give the tree over all n leaves.
    for (int64_t cut = 0; cut <= n; ++cut) {
      INFO("leaves " << n << ", cut at " << cut);
      TreeSum<double> sum(plus);
      for (const auto& [first, end] : {std::pair{int64_t{0}, cut}, std::pair{cut, n}}) {
        for (const TreeNode& node : covering_nodes(first, end)) {
          const std::span<const double> leaves(x.data() + node.first(), static_cast<size_t>(node.size()));
          sum.push(tree_sum(leaves), node);
        }
      }
      CHECK(sum.finish() == by_definition(x));
    }
  }
  // From another block (a rank's share): the stack is the nodes covering the share, each the
  // tree over its leaves, and finish() refuses what is no root.
  for (int64_t first = 1; first <= 12; ++first) {
    for (int64_t end = first + 1; end <= 24; ++end) {
      INFO("share [" << first << ", " << end << ")");
      const std::vector<double> x = awkward(end);
      TreeSum<double> share(plus);
      for (int64_t i = first; i < end; ++i) share.push(x[static_cast<size_t>(i)], TreeNode{.level = 0, .index = i});
      const std::vector<TreeNode> covering = covering_nodes(first, end);
      const auto nodes = share.take_nodes();
      REQUIRE(nodes.size() == covering.size());
      for (size_t k = 0; k < nodes.size(); ++k) {
        CHECK(nodes[k].first.level == covering[k].level);
        CHECK(nodes[k].first.index == covering[k].index);
        const std::span<const double> leaves(x.data() + covering[k].first(), static_cast<size_t>(covering[k].size()));
        CHECK(nodes[k].second == tree_sum(leaves));
      }
      CHECK(share.empty());
    }
  }
  TreeSum<double> share(plus);
  share.push(1.0, TreeNode{.level = 1, .index = 3});
  share.push(1.0, TreeNode{.level = 2, .index = 2});
  CHECK_THROWS_WITH(share.finish(), Catch::Contains("TreeSum: blocks [6, 12) are 2 nodes, not a tree's root"));
  TreeSum<double> sum(plus);
  sum.push(1.0, TreeNode{.level = 1, .index = 0});
  CHECK_THROWS_WITH(sum.push(1.0, TreeNode{.level = 0, .index = 3}),
                    Catch::Contains("TreeSum: a node of blocks [3, 4) pushed after blocks [0, 2)"));
}

TEST_CASE("the batch window: none by default, a range inside the batch", "[kernels][block_reduce]") {
  CHECK(batch_window().total == 0);
  set_batch_window({.first = 4, .count = 4, .total = 8});
  CHECK(batch_window().first == 4);
  set_batch_window({});
  CHECK(batch_window().total == 0);
  CHECK_THROWS_WITH(set_batch_window({.first = 6, .count = 4, .total = 8}),
                    Catch::Contains("sequences [6, 10) of 8; legal: a non-empty range inside the batch"));
}

TEST_CASE("block_rows: a sequence per block, off by default", "[kernels][block_reduce]") {
  CHECK(deterministic_block_tokens() == 0);
  CHECK(block_rows({4, 16, 32}, 2, "op") == 0);
  set_deterministic_block_tokens(16);
  CHECK(block_rows({4, 16, 32}, 2, "op") == 16);  // [sequences, tokens, features]: a sequence's rows
  CHECK(block_rows({4, 16, 32}, 1, "op") == 1);   // over sequences only: one entry each
  CHECK(block_rows({64, 32}, 1, "op") == 16);     // [tokens, features]: 16 rows
  CHECK_THROWS_WITH(block_rows({40, 32}, 1, "my_op"),
                    Catch::Contains("my_op: --deterministic sums blocks of one sequence (16 tokens)"));
  // reduce_rows: one call per block, or one call when off.
  std::vector<std::pair<int64_t, int64_t>> calls;
  auto count = [&](int64_t first, int64_t n) {
    calls.emplace_back(first, n);
    return std::vector<Tensor>{full({1}, static_cast<double>(n), kFloat64)};
  };
  CHECK(reduce_rows(64, 16, count)[0].data_ptr<double>()[0] == 64.0);
  CHECK(calls == std::vector<std::pair<int64_t, int64_t>>{{0, 16}, {16, 16}, {32, 16}, {48, 16}});
  set_deterministic_block_tokens(0);
  CHECK(block_rows({64, 32}, 1, "op") == 0);
  calls.clear();
  CHECK(reduce_rows(64, 0, count)[0].data_ptr<double>()[0] == 64.0);
  CHECK(calls == std::vector<std::pair<int64_t, int64_t>>{{0, 64}});
  CHECK_THROWS_WITH(set_deterministic_block_tokens(-1), Catch::Contains("legal: 0 (off) or more"));
}

}  // namespace
}  // namespace dtr
