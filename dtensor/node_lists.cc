#include "dtensor/node_lists.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "collectives/process_group.h"
#include "core/error.h"
#include "dtensor/placement.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"

namespace dtr {
namespace {

// The elements one exchange carries, at most (unless one tensor has more): 8 MiB of float32.
constexpr int64_t kGroupElements = int64_t{1} << 21;

// The mesh dims [first, first + count) that `v` is Partial(sum) over.
std::pair<int64_t, int64_t> summed_dims(const DTensor& v) {
  const Placements& p = v.placements();
  int64_t first = -1, count = 0;
  for (int64_t d = 0; d < static_cast<int64_t>(p.size()); ++d) {
    if (!p[static_cast<size_t>(d)].is_partial()) continue;
    DTR_CHECK(p[static_cast<size_t>(d)].reduce_op() == ReduceOp::kSum, ValueError,
              "reduce_node_lists: {} is Partial({}) on mesh dim {}; the tree sums Partial(sum) terms", v.to_string(),
              reduce_op_name(p[static_cast<size_t>(d)].reduce_op()), d);
    if (first < 0) first = d;
    DTR_CHECK(d == first + count, ValueError,
              "reduce_node_lists: {} is Partial over mesh dims that are not contiguous; the data-parallel dims are",
              v.to_string());
    ++count;
  }
  DTR_CHECK(count > 0, ValueError, "reduce_node_lists: {} is Partial over no mesh dim: nothing to reduce",
            v.to_string());
  return {first, count};
}

}  // namespace

std::vector<DTensor> reduce_node_lists(const std::vector<NodeTerm>& terms, int64_t share, int64_t blocks,
                                       std::span<const Placements> targets) {
  DTR_CHECK(!terms.empty() && share > 0, ValueError,
            "reduce_node_lists: {} nodes of shares of {} blocks; each rank holds at least one node", terms.size(),
            share);
  const std::vector<DTensor>& like = terms.front().values;
  DTR_CHECK(targets.size() == like.size(), ValueError, "reduce_node_lists: {} targets for {} tensors", targets.size(),
            like.size());
  for (size_t s = 0; s < terms.size(); ++s) {
    DTR_CHECK(terms[s].values.size() == like.size(), ValueError,
              "reduce_node_lists: node {} holds {} tensors, node 0 {}", s, terms[s].values.size(), like.size());
    for (size_t i = 0; i < like.size(); ++i) {
      DTR_CHECK(terms[s].values[i].spec() == like[i].spec(), ValueError,
                "reduce_node_lists: tensor {} is {} on node {} and {} on node 0; every node holds the same specs", i,
                terms[s].values[i].to_string(), s, like[i].to_string());
    }
  }
  // One exchange per mesh, dims and dtype (the tensors that share them, in order), of at most
  // kGroupElements elements unless one tensor has more: the buffers hold every node's copy.
  std::vector<std::vector<size_t>> groups;
  std::vector<int64_t> group_numel;
  for (size_t i = 0; i < like.size(); ++i) {
    const int64_t numel = like[i].to_local().numel();
    auto fits = [&](size_t g) {
      const DTensor& o = like[groups[g].front()];
      return o.mesh() == like[i].mesh() && o.dtype() == like[i].dtype() && summed_dims(o) == summed_dims(like[i]) &&
             group_numel[g] + numel <= kGroupElements;
    };
    size_t g = 0;
    while (g < groups.size() && !fits(g)) ++g;
    if (g == groups.size()) {
      groups.emplace_back();
      group_numel.push_back(0);
    }
    groups[g].push_back(i);
    group_numel[g] += numel;
  }
  std::vector<DTensor> out(like.size());
  // Every rank checks every group before any exchange, so all refuse alike.
  for (const std::vector<size_t>& members : groups) {
    const DTensor& lead = like[members.front()];
    const auto [m, count] = summed_dims(lead);
    const int64_t n = lead.mesh().flattened_group(m, count).size();
    DTR_CHECK(n * share == blocks, ValueError,
              "reduce_node_lists: {} is Partial over {} rank(s) of mesh dims [{}, {}), but shares of {} of {} blocks "
              "make {} data-parallel ranks",
              lead.to_string(), n, m, m + count, share, blocks, blocks / share);
  }
  for (const std::vector<size_t>& members : groups) {
    const DTensor& lead = like[members.front()];
    const DeviceMesh& mesh = lead.mesh();
    const auto [m, count] = summed_dims(lead);
    ProcessGroup& group = mesh.flattened_group(m, count);
    const int64_t n = group.size(), j = mesh.flat_index(m, count);
    // Every member's nodes, known from the share alone; this rank's must be the ones it holds.
    std::vector<std::vector<TreeNode>> nodes;
    size_t slots = 0;
    for (int64_t k = 0; k < n; ++k) {
      nodes.push_back(covering_nodes(k * share, (k + 1) * share));
      slots = std::max(slots, nodes.back().size());
    }
    const std::vector<TreeNode>& mine = nodes[static_cast<size_t>(j)];
    DTR_CHECK(
        std::equal(
            terms.begin(), terms.end(), mine.begin(), mine.end(),
            [](const NodeTerm& t, const TreeNode& c) { return t.node.level == c.level && t.node.index == c.index; }),
        ValueError,
        "reduce_node_lists: rank {} of {} holds {} node(s) from block {}; its share [{}, {}) is covered by {} "
        "node(s) from block {}",
        j, n, terms.size(), terms.front().node.first(), j * share, (j + 1) * share, mine.size(), mine.front().first());
    int64_t numel = 0;
    for (size_t i : members) numel += like[i].to_local().numel();
    const int64_t part = (numel + n - 1) / n;  // each member owns `part` of the elements
    const auto k_slots = static_cast<int64_t>(slots);
    const Device device = lead.to_local().device();
    // Block k of the send buffer: each of this rank's nodes' part k (slots it lacks stay zero).
    Tensor send = zeros({n, k_slots, part}, lead.dtype(), device);
    for (size_t s = 0; s < terms.size(); ++s) {
      Tensor flat = zeros({n * part}, lead.dtype(), device);
      int64_t offset = 0;
      for (size_t i : members) {
        const Tensor& local = terms[s].values[i].to_local();
        flat.narrow(0, offset, local.numel())
            .copy_(local.dim() == 0 ? local.unsqueeze(0) : local.reshape({local.numel()}));
        offset += local.numel();
      }
      send.select(1, static_cast<int64_t>(s)).copy_(flat.view({n, part}));
    }
    Tensor recv = Tensor::empty({n, k_slots, part}, lead.dtype(), device);
    group.all_to_all_single(recv, send).wait();
    // This rank's part of the whole batch's sum: every member's nodes in order of their blocks.
    TreeSum<Tensor> tree([](Tensor& left, const Tensor& right) { add_(left, right); });
    for (int64_t k = 0; k < n; ++k) {
      const std::vector<TreeNode>& theirs = nodes[static_cast<size_t>(k)];
      for (size_t s = 0; s < theirs.size(); ++s) {
        tree.push(recv.select(0, k).select(0, static_cast<int64_t>(s)).clone(), theirs[s]);
      }
    }
    const Tensor sum = tree.finish();
    Tensor all = Tensor::empty({n * part}, lead.dtype(), device);
    group.all_gather_into_tensor(all, sum).wait();
    int64_t offset = 0;
    for (size_t i : members) {
      const DTensor& v = like[i];
      const Tensor& local = v.to_local();
      const Tensor mine = all.narrow(0, offset, local.numel());
      const Tensor reduced = (local.dim() == 0 ? mine.select(0, 0) : mine.reshape(local.shape())).clone();
      offset += local.numel();
      const DTensorSpec summed(mesh, reduced_placements(v.placements()), v.shape(), v.dtype());
      out[i] = DTensor(reduced, summed).redistribute(targets[i]);
    }
  }
  return out;
}

}  // namespace dtr
