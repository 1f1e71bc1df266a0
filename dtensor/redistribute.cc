#include "dtensor/redistribute.h"

#include <functional>
#include <numeric>

#include "collectives/process_group.h"
#include "dtensor/chunking.h"
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

// The shape of the piece that the group along mesh_dim holds together: the tensor under
// `before` with mesh_dim replicated, seen from this rank.
Shape group_piece(const DTensorSpec& source, const Placements& before, int64_t mesh_dim) {
  Placements p = before;
  p[mesh_dim] = Replicate();
  return source.with_placements(std::move(p)).local_box().shape;
}

Exchange all_gather_exchange(const Tensor& local, const Shape& piece, int64_t d, int64_t n) {
  const int64_t c = chunk_capacity(piece[d], n);
  Exchange e;
  e.send = pad_rows(move_to_front(local, {d}), c);
  Shape out = e.send.shape();
  out[0] = n * c;
  e.recv = Tensor::empty(out, local.dtype(), local.device());
  e.unpack = [recv = e.recv, length = piece[d], c, d, n] {
    if (length == n * c) return move_back(recv, {d});
    std::vector<Tensor> parts;
    for (int64_t k = 0; k < n; ++k) parts.push_back(recv.narrow(0, k * c, chunk_range(length, n, k).length));
    return move_back(cat(parts, 0), {d});
  };
  return e;
}

Exchange reduce_scatter_exchange(const Tensor& local, int64_t d, int64_t n, int64_t j) {
  const int64_t length = local.size(d), c = chunk_capacity(length, n);
  Tensor front = move_to_front(local, {d});
  Exchange e;
  if (length == n * c) {
    e.send = front;  // a reduce_scatter only reads its input
  } else {
    Shape padded = front.shape();
    padded[0] = n * c;
    e.send = zeros(padded, local.dtype(), local.device());
    for (int64_t k = 0; k < n; ++k) {
      const ChunkRange r = chunk_range(length, n, k);
      e.send.narrow(0, k * c, r.length).copy_(front.narrow(0, r.offset, r.length));
    }
  }
  Shape out = front.shape();
  out[0] = c;
  e.recv = Tensor::empty(out, local.dtype(), local.device());
  e.unpack = [recv = e.recv, own = chunk_range(length, n, j).length, d] {
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

// The local result of a step that does not communicate.
Tensor local_step(const RedistributeStep& step, const Tensor& local, int64_t n, int64_t j) {
  switch (step.op) {
    case StepOp::kChunk: {
      const int64_t d = step.to.shard_dim();
      const ChunkRange r = chunk_range(local.size(d), n, j);
      return local.narrow(d, r.offset, r.length).clone();
    }
    case StepOp::kPartition: return j == 0 ? local.clone() : zeros_like(local);
    case StepOp::kRelabel: return local;
    default: DTR_INTERNAL_ASSERT(false, "local_step called for {}", step_op_name(step.op));
  }
}

}  // namespace

struct PendingRedistribute::InFlight {
  std::vector<Work> works;
  std::vector<Exchange> exchanges;
};

PendingRedistribute::PendingRedistribute(RedistributePlan plan, std::vector<Tensor> locals)
    : plan_(std::move(plan)), locals_(std::move(locals)) {
  DTR_INTERNAL_ASSERT(locals_.size() == plan_.sources().size(), "{} locals for {} sources", locals_.size(),
                      plan_.sources().size());
  // Collectives move no bool: bool tensors (masks) travel as int32 0/1 and turn back in wait().
  if (plan_.num_collectives() > 0) {
    for (Tensor& local : locals_) {
      if (local.dtype() == kBool) local = local.to(kInt32);
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
    const int64_t m = step.mesh_dim, n = mesh.size(m), j = mesh.coordinate()[m];
    if (!is_collective(step.op)) {
      for (Tensor& local : locals_) local = local_step(step, local, n, j);
      continue;
    }
    ProcessGroup& group = mesh.group(m);
    auto flight = std::make_unique<InFlight>();
    for (size_t i = 0; i < locals_.size(); ++i) {
      const Tensor& local = locals_[i];
      switch (step.op) {
        case StepOp::kAllGather:
          flight->exchanges.push_back(
              all_gather_exchange(local, group_piece(plan_.sources()[i], step.before, m), step.from.shard_dim(), n));
          break;
        case StepOp::kReduceScatter:
          flight->exchanges.push_back(reduce_scatter_exchange(local, step.to.shard_dim(), n, j));
          break;
        case StepOp::kAllToAll:
          flight->exchanges.push_back(all_to_all_exchange(local, group_piece(plan_.sources()[i], step.before, m),
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
  while (in_flight_) {
    for (const Work& w : in_flight_->works) w.wait();
    for (size_t i = 0; i < locals_.size(); ++i) locals_[i] = in_flight_->exchanges[i].unpack();
    in_flight_.reset();
    advance();
  }
  for (size_t i = 0; i < locals_.size(); ++i) {
    if (locals_[i].dtype() != plan_.sources()[i].dtype()) locals_[i] = locals_[i].to(plan_.sources()[i].dtype());
  }
  return locals_;
}

std::vector<Tensor> execute_redistribute(const RedistributePlan& plan, std::vector<Tensor> locals) {
  PendingRedistribute pending(plan, std::move(locals));
  return pending.wait();
}

}  // namespace dtr
