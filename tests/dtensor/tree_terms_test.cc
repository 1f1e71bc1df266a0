// dtensor/tree_terms.h on real ranks: shares of a batch that cut the canonical tree's nodes
// (6 leaves per rank on 3 ranks, 3 per rank on an hsdp-like 2 x 3 mesh), each rank's nodes
// summed apart and reduced in the tree, give the bits of one rank's tree over every leaf;
// a sum in rank order does not.
#include "dtensor/tree_terms.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "dtensor/device_mesh.h"
#include "kernels/elementwise.h"
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

// This rank's share [first, first + stride) pushed leaf by leaf from its first block: the
// nodes covering it, each a Partial term over `partial` on `mesh`.
std::vector<TreeTerm> share_terms(const DeviceMesh& mesh, const Placements& partial, int64_t first, int64_t stride) {
  TreeSum<Tensor> sum([](Tensor& left, const Tensor& right) { add_(left, right); });
  for (int64_t i = first; i < first + stride; ++i) sum.push(leaf(i), TreeNode{.level = 0, .index = i});
  std::vector<TreeTerm> terms;
  for (auto& [node, value] : sum.take_nodes()) {
    terms.push_back({node, {DTensor(value, DTensorSpec(mesh, partial, {5, 3}, kFloat32))}});
  }
  return terms;
}

TEST_CASE("reduce_tree_terms: shares that cut the tree's nodes give one rank's tree", "[dtensor][deterministic]") {
  run_ranks(3, [](int rank, int) {
    const DeviceMesh dp = init_device_mesh(kCPU, {3}, {"dp"});
    const int64_t stride = kLeaves / 3;
    const std::vector<TreeTerm> terms = share_terms(dp, {Partial()}, rank * stride, stride);
    CHECK(terms.size() == 2);  // [0, 4) [4, 6); [6, 8) [8, 12); [12, 16) [16, 18)
    const Placements targets[] = {{Replicate()}};
    const DTensor replicated = reduce_tree_terms(terms, stride, targets)[0];
    CHECK(replicated.placements() == Placements{Replicate()});
    CHECK(same_bits(replicated.to_local(), whole_tree()));
    const Placements sharded[] = {{Shard(0)}};
    const DTensor shard = reduce_tree_terms(terms, stride, sharded)[0];
    CHECK(same_bits(shard.full_tensor(), whole_tree()));
    // The ranks' sums added in rank order round differently: the test can tell.
    Tensor in_order = leaf(0).clone();
    for (int64_t i = 1; i < kLeaves; ++i) add_(in_order, leaf(i));
    CHECK_FALSE(same_bits(in_order, whole_tree()));
    // A rank whose nodes are not its share's is named.
    const std::vector<TreeTerm> wrong(terms.begin(), terms.begin() + 1);
    CHECK_THROWS_WITH(reduce_tree_terms(wrong, stride, targets),
                      Catch::Contains(fmt::format("reduce_tree_terms: rank {} of 3 holds 1 node(s)", rank)));
  });
}

TEST_CASE("reduce_tree_terms: Partial over both dims of a 2 x 3 mesh reduces over the six ranks in order",
          "[dtensor][deterministic]") {
  run_ranks(6, [](int rank, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {2, 3}, {"replicate", "shard"});
    const int64_t stride = kLeaves / 6;
    const std::vector<TreeTerm> terms = share_terms(mesh, {Partial(), Partial()}, rank * stride, stride);
    const Placements targets[] = {{Replicate(), Shard(0)}};
    const DTensor out = reduce_tree_terms(terms, stride, targets)[0];
    CHECK(out.placements() == Placements{Replicate(), Shard(0)});
    CHECK(same_bits(out.full_tensor(), whole_tree()));
  });
}

}  // namespace
}  // namespace dtr
