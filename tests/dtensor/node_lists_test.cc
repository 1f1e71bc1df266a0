// dtensor/node_lists.h on real ranks: shares of a batch that cut the canonical tree's nodes
// (6 leaves per rank on 3 ranks, 3 per rank on an hsdp-like 2 x 3 mesh), each rank's nodes
// summed apart and reduced in the tree, give the bits of one rank's tree over every leaf;
// a sum in rank order does not.
#include "dtensor/node_lists.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "collectives/collective_counter.h"
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
// nodes covering it, each a Partial term over `partial` on `mesh` (this rank's chunk of it
// where `partial` shards it too).
std::vector<NodeTerm> share_terms(const DeviceMesh& mesh, const Placements& partial, int64_t first, int64_t share) {
  TreeSum<Tensor> sum([](Tensor& left, const Tensor& right) { add_(left, right); });
  for (int64_t i = first; i < first + share; ++i) sum.push(leaf(i), TreeNode{.level = 0, .index = i});
  const DTensorSpec spec(mesh, partial, {5, 3}, kFloat32);
  std::vector<NodeTerm> terms;
  for (auto& [node, value] : sum.take_nodes()) {
    terms.push_back({node, {DTensor(chunk_of(value, spec.local_chunk()).contiguous(), spec)}});
  }
  return terms;
}

// The collectives reduce_node_lists issues for `targets`, with its result.
std::pair<DTensor, std::vector<CollectiveCount>> reduce_counted(const std::vector<NodeTerm>& terms, int64_t share,
                                                                const Placements& target) {
  collective_counter().reset();
  const Placements targets[] = {target};
  DTensor out = reduce_node_lists(terms, share, kLeaves, targets)[0];
  return {out, collective_counter().snapshot()};
}

// How many collectives of `kind` a snapshot holds.
int64_t calls(const std::vector<CollectiveCount>& counts, CollectiveKind kind) {
  int64_t total = 0;
  for (const CollectiveCount& c : counts) total += c.kind == kind ? c.calls : 0;
  return total;
}

TEST_CASE("reduce_node_lists: shares that cut the tree's nodes give one rank's tree", "[dtensor][deterministic]") {
  run_ranks(3, [](int rank, int) {
    const DeviceMesh dp = init_device_mesh(kCPU, {3}, {"dp"});
    const int64_t share = kLeaves / 3;
    const std::vector<NodeTerm> terms = share_terms(dp, {Partial()}, rank * share, share);
    CHECK(terms.size() == 2);  // [0, 4) [4, 6); [6, 8) [8, 12); [12, 16) [16, 18)
    const Placements targets[] = {{Replicate()}};
    const auto [replicated, replicate_calls] = reduce_counted(terms, share, {Replicate()});
    CHECK(replicated.placements() == Placements{Replicate()});
    CHECK(same_bits(replicated.to_local(), whole_tree()));
    CHECK(calls(replicate_calls, CollectiveKind::kAllToAll) == 1);
    CHECK(calls(replicate_calls, CollectiveKind::kAllGather) == 1);
    // A Shard target: each rank sums only its own rows (2, 2 and 1 of the 5), nothing gathered.
    const auto [shard, shard_calls] = reduce_counted(terms, share, {Shard(0)});
    CHECK(shard.placements() == Placements{Shard(0)});
    CHECK(same_bits(shard.to_local(), whole_tree().narrow(0, 2 * rank, rank < 2 ? 2 : 1)));
    CHECK(calls(shard_calls, CollectiveKind::kAllToAll) == 1);
    CHECK(issued_collectives() == 1);
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
    const auto [out, out_calls] = reduce_counted(terms, share, {Replicate(), Shard(0)});
    CHECK(out.placements() == Placements{Replicate(), Shard(0)});
    CHECK(same_bits(out.full_tensor(), whole_tree()));
    CHECK(calls(out_calls, CollectiveKind::kAllGather) == 1);
    // Sharded over both dims (rows 3 | 2, then 1, 1, 1 | 1, 1, 0: one rank holds none): no
    // gather.
    const auto [both, both_calls] = reduce_counted(terms, share, {Shard(0), Shard(0)});
    CHECK(both.to_local().size(0) == (rank == 5 ? 0 : 1));
    CHECK(calls(both_calls, CollectiveKind::kAllToAll) == 1);
    CHECK(calls(both_calls, CollectiveKind::kAllGather) == 0);
    CHECK(same_bits(both.full_tensor(), whole_tree()));
  });
}

TEST_CASE("reduce_node_lists: Partial over dp of a 3 x 2 (dp, tp) mesh, sharded on tp", "[dtensor][deterministic]") {
  run_ranks(6, [](int, int) {
    const DeviceMesh mesh = init_device_mesh(kCPU, {3, 2}, {"dp", "tp"});
    const int64_t share = kLeaves / 3, dp = mesh.coordinate()[0];
    const std::vector<NodeTerm> terms = share_terms(mesh, {Partial(), Shard(1)}, dp * share, share);
    // Rows over dp inside each tp rank's columns: no gather.
    const auto [rows, rows_calls] = reduce_counted(terms, share, {Shard(0), Shard(1)});
    CHECK(calls(rows_calls, CollectiveKind::kAllGather) == 0);
    CHECK(same_bits(rows.full_tensor(), whole_tree()));
    // Columns over dp first, then tp: tp rank 0's dp chunks (columns 0, 1, 2) leave its
    // columns [0, 2), so every rank gathers and redistributes, whatever its own chunks.
    const auto [cols, cols_calls] = reduce_counted(terms, share, {Shard(1), Shard(1)});
    CHECK(calls(cols_calls, CollectiveKind::kAllGather) >= 1);
    CHECK(same_bits(cols.full_tensor(), whole_tree()));
  });
}

}  // namespace
}  // namespace dtr
