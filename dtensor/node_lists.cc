#include "dtensor/node_lists.h"

#include <algorithm>
#include <cstdint>
#include <optional>
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

// `inner` as a chunk of `outer`'s local tensor (an empty one at offset 0), or nullopt when
// it does not lie inside `outer`.
std::optional<LocalChunk> chunk_within(const LocalChunk& outer, LocalChunk inner) {
  const bool empty = shape_numel(inner.shape) == 0;
  for (size_t d = 0; d < inner.shape.size(); ++d) {
    if (!empty &&
        (inner.offset[d] < outer.offset[d] || inner.offset[d] + inner.shape[d] > outer.offset[d] + outer.shape[d])) {
      return std::nullopt;
    }
    inner.offset[d] = empty ? 0 : inner.offset[d] - outer.offset[d];
  }
  return inner;
}

// Where each member of this rank's group over mesh dims [first, first + count) keeps its
// piece of v's sum under `target`, as chunks of this rank's local tensor (member k row-major
// over the dims): when the target shards the sum over every one of those dims in plain
// chunks and every rank's chunk lies inside what it holds of the sum (fully_shard's
// Shard(0)), so that each member sums only its own piece and nothing is gathered. Empty
// otherwise (Replicate on a reduced dim, a StridedShard, a Partial, a target that moves
// elements across the other mesh dims). Every rank of the mesh decides alike, as it checks every rank's chunk.
std::vector<LocalChunk> owned_chunks(const DTensor& v, const Placements& target, int64_t first, int64_t count) {
  const DeviceMesh& mesh = v.mesh();
  for (int64_t d = first; d < first + count; ++d) {
    if (!target[static_cast<size_t>(d)].is_shard()) return {};
  }
  // A Partial elsewhere would make each rank's sum a term again: redistribute's to make.
  for (const Placement& p : target) {
    if (p.is_partial()) return {};
  }
  if (!DTensorSpec::is_valid(mesh, target, v.shape(), v.dtype())) return {};
  const DTensorSpec summed = v.spec().with_placements(reduced_placements(v.placements()));
  const DTensorSpec split(mesh, target, v.shape(), v.dtype());
  if (summed.has_strided_pieces() || split.has_strided_pieces()) return {};
  for (int64_t r = 0; r < mesh.size(); ++r) {
    const std::vector<int64_t> c = mesh.coordinate_at(r);
    if (!chunk_within(summed.local_chunk(c), split.local_chunk(c))) return {};
  }
  const LocalChunk mine = summed.local_chunk();
  std::vector<int64_t> coordinate = mesh.coordinate();
  int64_t n = 1;
  for (int64_t d = first; d < first + count; ++d) n *= mesh.size(d);
  std::vector<LocalChunk> chunks;
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t d = first + count, rest = k; d-- > first; rest /= mesh.size(d)) {
      coordinate[static_cast<size_t>(d)] = rest % mesh.size(d);
    }
    chunks.push_back(*chunk_within(mine, split.local_chunk(coordinate)));
  }
  return chunks;
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
  // Per tensor, each member's piece when its target lets the member keep only that.
  std::vector<std::vector<LocalChunk>> owned;
  for (size_t i = 0; i < like.size(); ++i) {
    const auto [m, count] = summed_dims(like[i]);
    owned.push_back(owned_chunks(like[i], targets[i], m, count));
  }
  // One exchange per mesh, dims, dtype and kind of target (the tensors that share them, in
  // order), of at most kGroupElements elements unless one tensor has more: the buffers hold
  // every node's copy.
  std::vector<std::vector<size_t>> groups;
  std::vector<int64_t> group_numel;
  for (size_t i = 0; i < like.size(); ++i) {
    const int64_t numel = like[i].to_local().numel();
    auto fits = [&](size_t g) {
      const DTensor& o = like[groups[g].front()];
      return o.mesh() == like[i].mesh() && o.dtype() == like[i].dtype() && summed_dims(o) == summed_dims(like[i]) &&
             owned[groups[g].front()].empty() == owned[i].empty() && group_numel[g] + numel <= kGroupElements;
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
    // Member k owns `part` elements: its pieces of the tensors laid end to end (split), or
    // the k-th of n even parts of all their elements laid end to end.
    const bool split = !owned[members.front()].empty();
    int64_t part = 0;
    if (split) {
      for (int64_t k = 0; k < n; ++k) {
        int64_t size = 0;
        for (size_t i : members) size += shape_numel(owned[i][static_cast<size_t>(k)].shape);
        part = std::max(part, size);
      }
    } else {
      int64_t numel = 0;
      for (size_t i : members) numel += like[i].to_local().numel();
      part = (numel + n - 1) / n;
    }
    const auto k_slots = static_cast<int64_t>(slots);
    const Device device = lead.to_local().device();
    // Block k of the send buffer: each of this rank's nodes' part k (slots it lacks stay zero).
    Tensor send = zeros({n, k_slots, part}, lead.dtype(), device);
    for (size_t s = 0; s < terms.size(); ++s) {
      if (split) {
        for (int64_t k = 0; k < n; ++k) {
          const Tensor block = send.select(0, k).select(0, static_cast<int64_t>(s));
          int64_t offset = 0;
          for (size_t i : members) {
            const LocalChunk& c = owned[i][static_cast<size_t>(k)];
            const int64_t size = shape_numel(c.shape);
            if (size > 0) block.narrow(0, offset, size).view(c.shape).copy_(chunk_of(terms[s].values[i].to_local(), c));
            offset += size;
          }
        }
        continue;
      }
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
    if (split) {  // this rank's pieces are its targets' local tensors
      int64_t offset = 0;
      for (size_t i : members) {
        const LocalChunk& c = owned[i][static_cast<size_t>(j)];
        const int64_t size = shape_numel(c.shape);
        const DTensor& v = like[i];
        out[i] = DTensor(sum.narrow(0, offset, size).view(c.shape).clone(),
                         DTensorSpec(mesh, targets[i], v.shape(), v.dtype()));
        offset += size;
      }
      continue;
    }
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
