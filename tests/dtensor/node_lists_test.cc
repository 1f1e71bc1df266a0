// dtensor/node_lists.h on real ranks: shares of a batch that cut the canonical tree's nodes
// (6 leaves per rank on 3 ranks, 3 per rank on an hsdp-like 2 x 3 mesh), each rank's nodes
// summed apart and reduced in the tree, give the bits of one rank's tree over every leaf;
// a sum in rank order does not.
#include "dtensor/node_lists.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "dtensor/device_mesh.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "tests/testing/multi_rank.h"

namespace dtr {
namespace {

using testing::run_ranks;

constexpr int64_t kLeaves = 18;

// Leaf i of the batch: a [5, 3] tensor of one, or of numbers about half of one's last bit
// (some negative), whose sum depends on the order of additions.
Tensor leaf(int64_t i) {
  std::vector<float> v(15);
  for (size_t e = 0; e < v.size(); ++e) {
    const auto k = static_cast<int64_t>(e) + i;
    v[e] = i == 0 ? 1.0f : std::ldexp(1.0f + static_cast<float>(k % 4) / 8.0f, -24) * (k % 5 == 4 ? -1.0f : 1.0f);
  }
  return Tensor::from_vector<float>(v).view({5, 3});
}

// One rank's tree over all the leaves.
Tensor whole_tree() {
  return tree_sum(kLeaves, [](int64_t i) { return std::vector<Tensor>{leaf(i)}; })[0];
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && std::memcmp(x.data(), y.data(), static_cast<size_t>(x.numel()) * 4) == 0;
}

// This rank's share [first, first + share) pushed leaf by leaf from its first block: the
// nodes covering it, each a Partial term over `partial` on `mesh`.
std::vector<NodeTerm> share_terms(const DeviceMesh& mesh, const Placements& partial, int64_t first, int64_t share) {
  TreeSum<Tensor> sum([](Tensor& left, const Tensor& right) { add_(left, right); });
  for (int64_t i = first; i < first + share; ++i) sum.push(leaf(i), TreeNode{.level = 0, .index = i});
  std::vector<NodeTerm> terms;
  for (auto& [node, value] : sum.take_nodes()) {
    terms.push_back({node, {DTensor(value, DTensorSpec(mesh, partial, {5, 3}, kFloat32))}});
  }
  return terms;
}

TEST_CASE("reduce_node_lists: shares that cut the tree's nodes give one rank's tree", "[dtensor][deterministic]") {
  run_ranks(3, [](int rank, int) {
    const DeviceMesh dp = init_device_mesh(kCPU, {3}, {"dp"});
    const int64_t share = kLeaves / 3;
    const std::vector<NodeTerm> terms = share_terms(dp, {Partial()}, rank * share, share);
    CHECK(terms.size() == 2);  // [0, 4) [4, 6); [6, 8) [8, 12); [12, 16) [16, 18)
    const Placements targets[] = {{Replicate()}};
    const DTensor replicated = reduce_node_lists(terms, share, kLeaves, targets)[0];
    CHECK(replicated.placements() == Placements{Replicate()});
    CHECK(same_bits(replicated.to_local(), whole_tree()));
    const Placements sharded[] = {{Shard(0)}};
    const DTensor shard = reduce_node_lists(terms, share, kLeaves, sharded)[0];
    CHECK(same_bits(shard.full_tensor(), whole_tree()));
    // The ranks' sums added in rank order round differently: the test can tell.
    Tensor in_order = leaf(0).clone();
    for (int64_t i = 1; i < kLeaves; ++i) add_(in_order, leaf(i));
    CHECK_FALSE(same_bits(in_order, whole_tree()));
    // A rank whose nodes are not its share's is named.
    const std::vector<NodeTerm> wrong(terms.begin(), terms.begin() + 1);
    CHECK_THROWS_WITH(reduce_node_lists(wrong, share, kLeaves, targets),
                      Catch::Contains(fmt::format("reduce_node_lists: rank {} of 3 holds 1 node(s)", rank)));
    // Nodes whose tensors differ: named.
    std::vector<NodeTerm> mixed = terms;
    mixed.back().values[0] = DTensor(zeros({5, 4}), DTensorSpec(dp, {Partial()}, {5, 4}, kFloat32));
    CHECK_THROWS_WITH(reduce_node_lists(mixed, share, kLeaves, targets),
                      Catch::Contains("reduce_node_lists: tensor 0 is ") && Catch::Contains(" on node 1 and "));
    // Shares that do not make the group's size: refused on every rank before any exchange.
    CHECK_THROWS_WITH(
        reduce_node_lists(terms, share, 2 * kLeaves, targets),
        Catch::Contains(
            "is Partial over 3 rank(s) of mesh dims [0, 1), but shares of 6 of 36 blocks make 6 data-parallel ranks"));
  });
}

TEST_CASE("reduce_node_lists: several tensors per node, a scalar and bfloat16 ones, each one rank's tree",
          "[dtensor][deterministic]") {
  run_ranks(3, [](int rank, int) {
    const DeviceMesh dp = init_device_mesh(kCPU, {3}, {"dp"});
    const int64_t share = kLeaves / 3;
    // Per node: the [5, 3] leaf sums, the first element's as a scalar, and the leaves in
    // bfloat16 (their tree adds in bfloat16, as one rank's does).
    auto values = [&](int64_t first, int64_t size) {
      const std::vector<Tensor> sums = tree_sum(size, [&](int64_t i) {
        const Tensor x = leaf(first + i);
        return std::vector<Tensor>{x.clone(), x.select(0, 0).select(0, 0).clone(), x.to(kBFloat16)};
      });
      std::vector<DTensor> out;
      for (const Tensor& t : sums) out.emplace_back(t, DTensorSpec(dp, {Partial()}, t.shape(), t.dtype()));
      return out;
    };
    std::vector<NodeTerm> terms;
    for (const TreeNode& node : covering_nodes(rank * share, (rank + 1) * share)) {
      terms.push_back({node, values(node.first(), node.size())});
    }
    const std::vector<Placements> targets(3, Placements{Replicate()});
    const std::vector<DTensor> out = reduce_node_lists(terms, share, kLeaves, targets);
    const std::vector<Tensor> whole = tree_sum(kLeaves, [](int64_t i) {
      const Tensor x = leaf(i);
      return std::vector<Tensor>{x.clone(), x.select(0, 0).select(0, 0).clone(), x.to(kBFloat16)};
    });
    CHECK(same_bits(out[0].to_local(), whole[0]));
    REQUIRE(out[1].to_local().dim() == 0);
    CHECK(out[1].to_local().item() == whole[1].item());
    REQUIRE(out[2].dtype() == kBFloat16);
    CHECK(same_bits(out[2].to_local().to(kFloat32), whole[2].to(kFloat32)));
  });
}

TEST_CASE("reduce_node_lists: Partial over both dims of a 2 x 3 mesh reduces over the six ranks in order",
          "[dtensor][deterministic]") {
  run_ranks(6, [](int rank, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 3}, {"replicate", "shard"});
    const int64_t share = kLeaves / 6;
    const std::vector<NodeTerm> terms = share_terms(mesh, {Partial(), Partial()}, rank * share, share);
    const Placements targets[] = {{Replicate(), Shard(0)}};
    const DTensor out = reduce_node_lists(terms, share, kLeaves, targets)[0];
    CHECK(out.placements() == Placements{Replicate(), Shard(0)});
    CHECK(same_bits(out.full_tensor(), whole_tree()));
  });
}

}  // namespace
}  // namespace dtr
