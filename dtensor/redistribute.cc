#include "dtensor/redistribute.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <span>

#include "collectives/process_group.h"
#include "core/trace.h"
#include "dtensor/chunking.h"
#include "dtensor/internal/reduce_identity.h"
#include "kernels/block_reduce.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "kernels/shape_ops.h"

namespace dtr {
namespace {

// x with dims `front` moved to the front (in that order), the others after them in
// order, as a new contiguous tensor (or x itself when nothing moves and x is contiguous).
Tensor move_to_front(const Tensor& x, const std::vector<int64_t>& front) {
  std::vector<int64_t> perm = front;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (std::find(front.begin(), front.end(), d) == front.end()) perm.push_back(d);
  }
  return x.permute(perm).contiguous();
}

// The inverse of move_to_front: y's leading dims go back to positions `front`.
Tensor move_back(const Tensor& y, const std::vector<int64_t>& front) {
  std::vector<int64_t> perm = front;
  for (int64_t d = 0; d < y.dim(); ++d) {
    if (std::find(front.begin(), front.end(), d) == front.end()) perm.push_back(d);
  }
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return y.permute(inverse).contiguous();
}

// x (rows along dim 0) zero-padded to `rows` rows.
Tensor pad_rows(const Tensor& x, int64_t rows) {
  if (x.size(0) == rows) return x;
  Shape shape = x.shape();
  shape[0] = rows;
  Tensor padded = zeros(shape, x.dtype(), x.device());
  padded.narrow(0, 0, x.size(0)).copy_(x);
  return padded;
}

// What one tensor of a step gives the collective and how it becomes the new local.
struct Exchange {
  Tensor send;
  Tensor recv;
  std::function<Tensor()> unpack;
};

// The shape of the piece that the group of `step` holds together: the tensor under
// step.before with the step's mesh dims replicated, seen from this rank.
Shape group_piece(const DTensorSpec& source, const RedistributeStep& step) {
  Placements p = step.before;
  for (int64_t i = step.mesh_dim; i < step.mesh_dim + step.num_mesh_dims; ++i) p[i] = Replicate();
  return source.with_placements(std::move(p)).local_shape();
}

// The rows of a piece dim of `length` that each member of the step's group holds, in group
// order and in each member's local order, and the capacity every member pads its rows to.
// Shard: one chunk each, nested over the step's mesh dims (plain chunking for one), in
// order along the dim; StridedShard (one mesh dim): its chunk of every block.
struct MemberRows {
  std::vector<std::vector<ChunkRange>> rows;
  int64_t capacity;
  bool in_order;  // member k's rows are one range, right after member k - 1's
};

MemberRows member_rows(const DeviceMesh& mesh, const RedistributeStep& step, const Placement& split, int64_t length) {
  MemberRows m;
  if (split.is_strided_shard()) {
    const int64_t n = mesh.shape()[step.mesh_dim];
    for (int64_t k = 0; k < n; ++k) m.rows.push_back(strided_rows(length, split.split_factor(), n, k));
    m.capacity = strided_capacity(length, split.split_factor(), n);
    m.in_order = false;
    return m;
  }
  const std::span<const int64_t> sizes = std::span(mesh.shape()).subspan(step.mesh_dim, step.num_mesh_dims);
  for (const ChunkRange& chunk : nested_chunks(length, sizes)) m.rows.push_back({chunk});
  m.capacity = chunk_capacity(length, shape_numel(sizes));
  m.in_order = true;
  return m;
}

// Every member sends its rows padded to the capacity c; member k's block of the result
// holds its rows in its local order, which unpack puts back at their places in the piece.
Exchange all_gather_exchange(const Tensor& local, int64_t length, const MemberRows& members, int64_t d) {
  const auto n = static_cast<int64_t>(members.rows.size());
  const int64_t c = members.capacity;
  Exchange e;
  e.send = pad_rows(move_to_front(local, {d}), c);
  Shape out = e.send.shape();
  out[0] = n * c;
  e.recv = Tensor::empty(out, local.dtype(), local.device());
  e.unpack = [recv = e.recv, length, members, c, d, n] {
    if (members.in_order) {
      if (length == n * c) return move_back(recv, {d});
      std::vector<Tensor> parts;
      for (int64_t k = 0; k < n; ++k) parts.push_back(recv.narrow(0, k * c, members.rows[k][0].length));
      return move_back(cat(parts, 0), {d});
    }
    Shape shape = recv.shape();
    shape[0] = length;
    Tensor piece = Tensor::empty(shape, recv.dtype(), recv.device());
    for (int64_t k = 0; k < n; ++k) {
      int64_t at = k * c;
      for (const ChunkRange& r : members.rows[k]) {
        piece.narrow(0, r.offset, r.length).copy_(recv.narrow(0, at, r.length));
        at += r.length;
      }
    }
    return move_back(piece, {d});
  };
  return e;
}

// Block k of the input is member k's rows of the local piece, padded to the capacity c.
Exchange reduce_scatter_exchange(const Tensor& local, const MemberRows& members, int64_t d, int64_t j) {
  const auto n = static_cast<int64_t>(members.rows.size());
  const int64_t length = local.size(d), c = members.capacity;
  Tensor front = move_to_front(local, {d});
  Exchange e;
  if (members.in_order && length == n * c) {
    e.send = front;  // a reduce_scatter only reads its input
  } else {
    Shape padded = front.shape();
    padded[0] = n * c;
    e.send = zeros(padded, local.dtype(), local.device());
    for (int64_t k = 0; k < n; ++k) {
      int64_t at = k * c;
      for (const ChunkRange& r : members.rows[k]) {
        e.send.narrow(0, at, r.length).copy_(front.narrow(0, r.offset, r.length));
        at += r.length;
      }
    }
  }
  Shape out = front.shape();
  out[0] = c;
  e.recv = Tensor::empty(out, local.dtype(), local.device());
  e.unpack = [recv = e.recv, own = ranges_length(members.rows[j]), d] {
    return move_back(recv.narrow(0, 0, own), {d});
  };
  return e;
}

// Shard(a) -> Shard(b): block k of the send buffer is this rank's a-chunk of b-chunk k;
// block k of the receive buffer is rank k's a-chunk of this rank's b-chunk. Both are
// padded to (capacity along b, capacity along a).
Exchange all_to_all_exchange(const Tensor& local, const Shape& piece, int64_t a, int64_t b, int64_t n, int64_t j) {
  const int64_t ca = chunk_capacity(piece[a], n), cb = chunk_capacity(piece[b], n);
  Tensor front = move_to_front(local, {b, a});  // [piece[b], own a-chunk, rest...]
  Shape block = front.shape();
  block[0] = cb;
  block[1] = ca;
  Shape buffer = block;
  buffer.insert(buffer.begin(), n);
  Exchange e;
  e.send = zeros(buffer, local.dtype(), local.device());
  for (int64_t k = 0; k < n; ++k) {
    const ChunkRange rb = chunk_range(piece[b], n, k);
    e.send.select(0, k)
        .narrow(0, 0, rb.length)
        .narrow(1, 0, front.size(1))
        .copy_(front.narrow(0, rb.offset, rb.length));
  }
  e.recv = Tensor::empty(buffer, local.dtype(), local.device());
  e.unpack = [recv = e.recv, piece, a, b, n, j] {
    const int64_t own_b = chunk_range(piece[b], n, j).length;
    std::vector<Tensor> parts;
    for (int64_t k = 0; k < n; ++k) {
      parts.push_back(recv.select(0, k).narrow(0, 0, own_b).narrow(1, 0, chunk_range(piece[a], n, k).length));
    }
    return move_back(cat(parts, 1), {b, a});
  };
  return e;
}

// Under --deterministic (kernels/block_reduce.h) on more than two ranks, a sum over the
// group in the canonical tree of its members (member k holding node k, in group order)
// rather than the ring's order: one all_to_all gives each member every member's block of
// its part of every exchange (block k of the packed buffer: each exchange's block k,
// flattened, in order), which it sums in the tree. The same bytes as a ring
// reduce-scatter. The exchanges are a step's reduce-scatters (send: the members' blocks;
// recv: this member's) of one dtype; each unpack now sums its part before it unpacks.
Work tree_reduce_scatter(ProcessGroup& group, std::span<Exchange> exchanges, ReduceOp op) {
  const int64_t n = group.size();
  int64_t total = 0;
  for (const Exchange& e : exchanges) total += e.recv.numel();
  const Tensor& first = exchanges.front().send;
  Tensor send = Tensor::empty({n, total}, first.dtype(), first.device());
  int64_t offset = 0;
  for (const Exchange& e : exchanges) {
    const int64_t part = e.recv.numel();
    send.narrow(1, offset, part).copy_(e.send.reshape({n, part}));
    offset += part;
  }
  Tensor blocks = Tensor::empty({n, total}, first.dtype(), first.device());
  Work work = group.all_to_all_single(blocks, send);
  offset = 0;
  for (Exchange& e : exchanges) {
    const int64_t part = e.recv.numel();
    e.unpack = [blocks, recv = e.recv, n, offset, part, op, unpack = std::move(e.unpack)] {
      Tensor sum =
          tree_sum(n, [&](int64_t k) { return std::vector{blocks.select(0, k).narrow(0, offset, part).clone()}; })[0];
      if (op == ReduceOp::kAvg) sum = mul(sum, 1.0 / static_cast<double>(n));
      Tensor out = recv;
      out.copy_(sum.view(recv.shape()));
      return unpack();
    };
    offset += part;
  }
  return work;
}

// The all-reduces of a step's tensors (every member's whole tensor; one dtype) in the
// canonical tree: their elements flattened end to end in n parts, tree_reduce_scatter, then
// one all_gather of the parts (blocking, when the first exchange unpacks). The same bytes
// as a ring all-reduce.
Work tree_all_reduce(ProcessGroup& group, std::span<Exchange> exchanges, ReduceOp op) {
  const int64_t n = group.size();
  int64_t numel = 0;
  for (const Exchange& e : exchanges) numel += e.recv.numel();
  const int64_t c = (numel + n - 1) / n;
  const Tensor& first = exchanges.front().recv;
  std::vector<Exchange> part(1);
  part[0].send = zeros({n * c}, first.dtype(), first.device());
  int64_t offset = 0;
  for (const Exchange& e : exchanges) {
    const Tensor& t = e.recv;
    part[0].send.narrow(0, offset, t.numel()).copy_(t.dim() == 0 ? t.unsqueeze(0) : t.reshape({t.numel()}));
    offset += t.numel();
  }
  part[0].recv = Tensor::empty({c}, first.dtype(), first.device());
  auto all = std::make_shared<Tensor>();  // the gathered sums, once the first exchange unpacks
  part[0].unpack = [&group, n, c, all, mine = part[0].recv] {
    *all = Tensor::empty({n * c}, mine.dtype(), mine.device());
    group.all_gather_into_tensor(*all, mine).wait();
    return *all;
  };
  Work work = tree_reduce_scatter(group, part, op);
  offset = 0;
  for (Exchange& e : exchanges) {
    e.unpack = [all, gather = part[0].unpack, t = e.recv, offset] {
      if (!all->defined()) gather();
      Tensor out = t;
      const Tensor mine = all->narrow(0, offset, t.numel());
      out.copy_(t.dim() == 0 ? mine.select(0, 0) : mine.view(t.shape()));
      return t;
    };
    offset += e.recv.numel();
  }
  return work;
}

// The local result of a step that does not communicate, for a tensor whose elements are of
// dtype `values`; `piece` is the shape the step's group holds together.
Tensor local_step(const RedistributeStep& step, const Tensor& local, const Shape& piece, DType values, int64_t n,
                  int64_t j) {
  switch (step.op) {
    case StepOp::kChunk: {
      const int64_t d = step.to.shard_dim();
      std::vector<Tensor> rows;
      for (const ChunkRange& r : strided_rows(local.size(d), step.to.split_factor(), n, j)) {
        rows.push_back(local.narrow(d, r.offset, r.length));
      }
      if (rows.empty()) rows.push_back(local.narrow(d, 0, 0));
      return rows.size() == 1 ? rows[0].clone() : cat(rows, d);
    }
    case StepOp::kPad: {
      const int64_t d = step.from.shard_dim();
      Tensor padded = internal::full_of_identity(piece, step.to.reduce_op(), values, local.dtype(), local.device());
      padded.narrow(d, chunk_range(piece[d], n, j).offset, local.size(d)).copy_(local);
      return padded;
    }
    case StepOp::kPartition: return j == 0 ? local.clone() : zeros_like(local);
    case StepOp::kRelabel: return local;
    default: DTR_INTERNAL_ASSERT(false, "local_step called for {}", step_op_name(step.op));
  }
}

// The step's placements and this rank's bytes, on its trace span.
void trace_step(trace::Span& span, const RedistributeStep& step, const DeviceMesh& mesh) {
  span.arg("mesh_dims", fmt::format("[{}, {})", step.mesh_dim, step.mesh_dim + step.num_mesh_dims));
  span.arg("from", placements_str(step.before));
  span.arg("to", placements_str(step.after));
  const auto me = static_cast<size_t>(mesh.flat_index(0, mesh.ndim()));
  if (me < step.send_bytes.size()) {
    span.arg("send_bytes", step.send_bytes[me]);
    span.arg("recv_bytes", step.recv_bytes[me]);
  }
}

}  // namespace

struct PendingRedistribute::InFlight {
  std::vector<Work> works;
  std::vector<Exchange> exchanges;
};

PendingRedistribute::PendingRedistribute(RedistributePlan plan, std::vector<Tensor> locals,
                                         std::optional<Device> device)
    : plan_(std::move(plan)), locals_(std::move(locals)) {
  DTR_INTERNAL_ASSERT(locals_.size() == plan_.sources().size(), "{} locals for {} sources", locals_.size(),
                      plan_.sources().size());
  for (const Tensor& local : locals_) homes_.push_back(device.value_or(local.device()));
  // Collectives move no bool: bool tensors (masks) travel as int32 0/1 and turn back in
  // wait(); they move tensors on the mesh's device, where other locals are copied (queued
  // only, from pinned memory) and from where wait() copies the results home.
  if (plan_.num_collectives() > 0) {
    const Device on = plan_.mesh().device();
    for (Tensor& local : locals_) {
      if (local.dtype() == kBool) local = local.to(kInt32);
      if (local.device() != on) local = local.to(on, /*non_blocking=*/local.is_pinned());
    }
  }
  advance();
}

PendingRedistribute::~PendingRedistribute() {
  // A redistribute dropped unread still owns buffers the comm thread writes: let it finish.
  if (in_flight_) {
    for (const Work& w : in_flight_->works) {
      try {
        w.wait();
      } catch (...) {  // the error belonged to a result nobody asked for
      }
    }
  }
}

void PendingRedistribute::advance() {
  const DeviceMesh& mesh = plan_.mesh();
  while (next_step_ < plan_.steps().size()) {
    const RedistributeStep& step = plan_.steps()[next_step_++];
    const int64_t m = step.mesh_dim, count = step.num_mesh_dims;
    const int64_t n = shape_numel(std::span(mesh.shape()).subspan(m, count)), j = mesh.flat_index(m, count);
    // Issuing the step (a local step: doing it); a collective's transfer is its own span.
    trace::Span span(step_op_name(step.op), trace::Category::kRedistribute);
    if (span.active()) trace_step(span, step, mesh);
    if (!is_collective(step.op)) {
      for (size_t i = 0; i < locals_.size(); ++i) {
        const DTensorSpec& source = plan_.sources()[i];
        const Shape piece = step.op == StepOp::kPad ? group_piece(source, step) : Shape{};
        locals_[i] = local_step(step, locals_[i], piece, source.dtype(), n, j);
      }
      continue;
    }
    ProcessGroup& group = mesh.flattened_group(m, count);
    auto flight = std::make_unique<InFlight>();
    for (size_t i = 0; i < locals_.size(); ++i) {
      const Tensor& local = locals_[i];
      switch (step.op) {
        case StepOp::kAllGather: {
          const int64_t d = step.from.shard_dim(), length = group_piece(plan_.sources()[i], step)[d];
          flight->exchanges.push_back(
              all_gather_exchange(local, length, member_rows(mesh, step, step.from, length), d));
          break;
        }
        case StepOp::kReduceScatter: {
          const int64_t d = step.to.shard_dim();
          flight->exchanges.push_back(
              reduce_scatter_exchange(local, member_rows(mesh, step, step.to, local.size(d)), d, j));
          break;
        }
        case StepOp::kAllToAll:
          flight->exchanges.push_back(all_to_all_exchange(local, group_piece(plan_.sources()[i], step),
                                                          step.from.shard_dim(), step.to.shard_dim(), n, j));
          break;
        case StepOp::kAllReduce: {
          Tensor t = local.clone();
          flight->exchanges.push_back({t, t, [t] { return t; }});
          break;
        }
        default: DTR_INTERNAL_ASSERT(false, "{} is not a collective", step_op_name(step.op));
      }
    }
    std::vector<Tensor> sends, recvs;
    for (const Exchange& e : flight->exchanges) {
      sends.push_back(e.send);
      recvs.push_back(e.recv);
    }
    const bool single = sends.size() == 1;
    const bool tree = deterministic_block_tokens() > 0 && group.size() > 2 && sums_partial(step);
    if (tree) {
      // One collective for the step's tensors when they share a dtype, else one each.
      const bool one_dtype =
          std::all_of(sends.begin(), sends.end(), [&](const Tensor& t) { return t.dtype() == sends.front().dtype(); });
      std::vector<std::span<Exchange>> groups;
      if (one_dtype) {
        groups.emplace_back(flight->exchanges);
      } else {
        for (Exchange& e : flight->exchanges) groups.emplace_back(&e, 1);
      }
      for (std::span<Exchange> g : groups) {
        flight->works.push_back(step.op == StepOp::kReduceScatter ? tree_reduce_scatter(group, g, step.from.reduce_op())
                                                                  : tree_all_reduce(group, g, step.from.reduce_op()));
      }
      in_flight_ = std::move(flight);
      return;
    }
    switch (step.op) {
      case StepOp::kAllGather:
        flight->works.push_back(single ? group.all_gather_into_tensor(recvs[0], sends[0])
                                       : group.all_gather_into_tensor_coalesced(recvs, sends));
        break;
      case StepOp::kReduceScatter:
        flight->works.push_back(single ? group.reduce_scatter_tensor(recvs[0], sends[0], step.from.reduce_op())
                                       : group.reduce_scatter_tensor_coalesced(recvs, sends, step.from.reduce_op()));
        break;
      case StepOp::kAllReduce:
        flight->works.push_back(single ? group.all_reduce(recvs[0], step.from.reduce_op())
                                       : group.all_reduce_coalesced(recvs, step.from.reduce_op()));
        break;
      default:  // all_to_all: the process group has no coalesced form; one collective per tensor
        for (size_t i = 0; i < sends.size(); ++i) flight->works.push_back(group.all_to_all_single(recvs[i], sends[i]));
    }
    in_flight_ = std::move(flight);
    return;
  }
}

const std::vector<Tensor>& PendingRedistribute::wait() {
  // Each result's to_local() waits: after the first, nothing is left to do (a coalesced
  // bucket's P results would otherwise revisit all P, P times).
  if (done_) return locals_;
  while (in_flight_) {
    for (const Work& w : in_flight_->works) w.wait();
    for (size_t i = 0; i < locals_.size(); ++i) locals_[i] = in_flight_->exchanges[i].unpack();
    in_flight_.reset();
    advance();
  }
  for (size_t i = 0; i < locals_.size(); ++i) {
    if (locals_[i].dtype() != plan_.sources()[i].dtype()) locals_[i] = locals_[i].to(plan_.sources()[i].dtype());
    locals_[i] = locals_[i].to(homes_[i]);
  }
  done_ = true;
  return locals_;
}

std::vector<Tensor> execute_redistribute(const RedistributePlan& plan, std::vector<Tensor> locals) {
  PendingRedistribute pending(plan, std::move(locals));
  return pending.wait();
}

}  // namespace dtr
