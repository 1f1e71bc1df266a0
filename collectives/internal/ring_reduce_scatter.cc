#include "collectives/internal/ring_reduce_scatter.h"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "collectives/internal/wire_dtype.h"
#include "core/error.h"

namespace dtr::gloo_ring {
namespace {

// Gloo's collectives use unbound slot prefixes 0x01..0x08; the all-reduce's gather uses
// this one, so its messages never match a Gloo collective's receive.
constexpr uint8_t kGatherSlotPrefix = 0x11;

struct Piece {
  int64_t start;
  int64_t len;
};

// One call's layout: block offsets and the pieces (at most piece_bytes each) of a block.
struct Layout {
  Layout(const std::vector<int64_t>& block_counts, size_t elem, int64_t piece_bytes)
      : counts(block_counts), offsets(block_counts.size()) {
    std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), int64_t{0});
    const int64_t max_count = *std::max_element(counts.begin(), counts.end());
    const int64_t piece_elems = piece_bytes / static_cast<int64_t>(elem);
    pieces = std::max<int64_t>(1, (max_count + piece_elems - 1) / piece_elems);
  }

  const std::vector<int64_t>& counts;
  std::vector<int64_t> offsets;
  int64_t pieces;  // per block; piece k of block b has about counts[b] / pieces elements

  Piece piece(int block, int64_t k) const {
    const int64_t c = counts[block];
    const int64_t size = (c + pieces - 1) / pieces;
    const int64_t start = std::min(c, k * size);
    return {start, std::min(c - start, size)};
  }
  int64_t total() const { return offsets.back() + counts.back(); }
};

// Runs a Gloo wait; its error gains what() of the ring (described only on failure).
template <class Wait, class What>
void adding_context(const Wait& wait, const What& what) {
  try {
    wait();
  } catch (const gloo::Exception& e) {
    throw gloo::IoException(fmt::format("{} ({})", e.what(), what()));
  }
}

}  // namespace

Ring::Ring(gloo::Context& context, RingShape shape)
    : context_(context),
      shape_(shape),
      n_(context.size),
      rank_(context.rank),
      pool_slot_(context.nextSlot(2 * context.size)) {
  DTR_INTERNAL_ASSERT(shape.piece_bytes > 0 && shape.piece_bytes % 8 == 0 && shape.slots >= 2,
                      "ring: pieces of {} bytes in {} slots", shape.piece_bytes, shape.slots);
  if (n_ == 1) return;  // nothing to send or receive
  const int next = (rank_ + 1) % n_, prev = (rank_ + n_ - 1) % n_;
  const size_t pool_bytes = shape.slots * shape.piece_bytes;
  pool_ = Tensor::empty({static_cast<int64_t>(pool_bytes / sizeof(float))}, kFloat32);  // only its bytes count
  // A pair unregisters a buffer's slot when any buffer of that slot goes away: rank r
  // receives on slots ending in r and sends on its peers', so a send buffer never takes a
  // receive's registration with it, even when rank-1 is rank+1 (two ranks).
  pool_recv_ = context.getPair(prev)->createRecvBuffer(pool_slot_ + rank_, pool_.data(), pool_bytes);
  pool_send_ = context.getPair(next)->createSendBuffer(pool_slot_ + next, pool_.data(), pool_bytes);
  ack_send_ = context.getPair(prev)->createSendBuffer(pool_slot_ + n_ + prev, &ack_out_, 1);
  ack_recv_ = context.getPair(next)->createRecvBuffer(pool_slot_ + n_ + rank_, &ack_in_, 1);
}

// Waits for rank+1's last credits, sent by the end of its last call: one arriving after its
// buffer is gone would stop the pair (Gloo holds data for an unknown slot until one
// registers). A failed ring's pairs are closed, and their waits throw at once.
Ring::~Ring() {
  if (broken_) return;  // the credits are lost with the connections
  for (; acked_ < sent_; ++acked_) {
    try {
      ack_recv_->waitRecv();
    } catch (...) {  // a destructor never throws: a failed wait means the credits are lost too
      return;
    }
  }
}

void Ring::send(gloo::transport::Buffer& from, size_t offset, size_t bytes) {
  if (sent_ - acked_ >= shape_.slots) {
    release(0);
    for (; sent_ - acked_ >= shape_.slots; ++acked_) {
      adding_context([&] { ack_recv_->waitRecv(); },
                     [&] { return fmt::format("ring: waiting for rank {} to free a slot", (rank_ + 1) % n_); });
    }
  }
  from.send(offset, bytes, static_cast<size_t>(sent_ % shape_.slots * shape_.piece_bytes));
  ++sent_;
}

std::byte* Ring::receive(std::string_view phase, int step, int block) {
  release(shape_.slots - 1);  // rank-1's next piece may need the oldest slot back
  adding_context([&] { pool_recv_->waitRecv(); },
                 [&] {
                   return fmt::format("ring {} step {} of {}: receiving block {} from rank {}", phase, step + 1, n_ - 1,
                                      block, (rank_ + n_ - 1) % n_);
                 });
  return static_cast<std::byte*>(pool_.data()) + received_++ % shape_.slots * shape_.piece_bytes;
}

void Ring::release(size_t keep) {
  for (; unreturned_.size() > keep; unreturned_.pop_front()) {
    if (unreturned_.front()) {
      adding_context([&] { pool_send_->waitSend(); },
                     [&] { return fmt::format("ring: sending to rank {}", (rank_ + 1) % n_); });
    }
    ack_send_->send();  // waited for at the end of the call: it may queue behind pieces to rank-1
    ++acks_unwaited_;
  }
}

void Ring::abandon() {
  broken_ = true;
  for (int r = 0; r < n_; ++r) {
    try {
      if (auto& pair = context_.getPair(r)) pair->close();
    } catch (const std::exception&) {  // a pair that failed is closed already; closing it again may throw
    }
  }
}

// Per window of slots-1 pieces per block: this rank's own copy of block rank-1 goes out,
// then each step receives its block's pieces, adds this rank's copy and sends the sum on,
// but at the last step, which leaves the total in output (and, for an all-reduce, sends it
// round the ring: step s of the gather receives block (r-s-1) mod n and forwards it, but at
// the last step). Gather receives are posted before the reduce-scatter starts, straight
// into input: a rank's copy of a block is read before the reduced block can come back (it
// is part of that block's sum).
template <class T>
int64_t Ring::run(ReduceOp op, const T* input, T* output, const std::vector<int64_t>& counts,
                  const uint32_t* gather_tag) {
  const Layout layout(counts, sizeof(T), shape_.piece_bytes);
  const int n = n_, rank = rank_, next = (rank + 1) % n, prev = (rank + n - 1) % n;
  const int64_t total = layout.total();
  if (total == 0) return 0;  // counts are global: every rank skips
  if (broken_) {
    throw gloo::IoException("ring: an earlier collective on this context failed; its connections are closed");
  }
  auto* in = const_cast<T*>(input);
  std::unique_ptr<gloo::transport::Buffer> in_send =
      context_.getPair(next)->createSendBuffer(pool_slot_ + next, in, total * sizeof(T));
  std::unique_ptr<gloo::transport::UnboundBuffer> gather =
      gather_tag != nullptr ? context_.createUnboundBuffer(in, total * sizeof(T)) : nullptr;
  const uint64_t gather_slot = gather_tag != nullptr ? gloo::Slot::build(kGatherSlotPrefix, *gather_tag) : 0;
  auto gather_block = [&](int step) { return ((rank - step - 1) % n + n) % n; };
  auto bytes_at = [&](int block, const Piece& p) { return (layout.offsets[block] + p.start) * sizeof(T); };
  int64_t input_sent = 0, gather_sent = 0, bytes_sent = 0;
  auto send_gather = [&](int block, const Piece& p) {
    gather->send(next, gather_slot, bytes_at(block, p), p.len * sizeof(T));
    ++gather_sent;
    bytes_sent += p.len * sizeof(T);
  };
  const std::chrono::milliseconds timeout = context_.getTimeout();
  try {
    if (gather) {
      for (int step = 0; step < n - 1; ++step) {
        for (int64_t k = 0; k < layout.pieces; ++k) {
          const Piece p = layout.piece(gather_block(step), k);
          if (p.len > 0) gather->recv(prev, gather_slot, bytes_at(gather_block(step), p), p.len * sizeof(T));
        }
      }
    }
    const int first = (rank + n - 1) % n;
    const int64_t window = shape_.slots - 1;
    for (int64_t w = 0; w < layout.pieces; w += window) {
      const int64_t window_end = std::min(layout.pieces, w + window);
      for (int64_t k = w; k < window_end; ++k) {
        const Piece p = layout.piece(first, k);
        if (p.len == 0) continue;
        send(*in_send, bytes_at(first, p), p.len * sizeof(T));
        ++input_sent;
        bytes_sent += p.len * sizeof(T);
      }
      for (int step = 0; step < n - 1; ++step) {
        const int block = ((rank - step - 2) % n + n) % n;
        for (int64_t k = w; k < window_end; ++k) {
          const Piece p = layout.piece(block, k);
          if (p.len == 0) continue;
          std::byte* slot = receive("reduce_scatter", step, block);
          T* got = reinterpret_cast<T*>(slot);
          const T* mine = input + layout.offsets[block] + p.start;
          if (step == n - 2) {
            combine(output + p.start, mine, got, p.len, op);
            if (op == ReduceOp::kAvg) divide_by(output + p.start, p.len, n);
            consumed(Forwarded::kNo);
            if (gather) send_gather(block, p);
          } else {
            combine(got, got, mine, p.len, op);
            send(*pool_send_, slot - static_cast<std::byte*>(pool_.data()), p.len * sizeof(T));
            consumed(Forwarded::kYes);
            bytes_sent += p.len * sizeof(T);
          }
        }
      }
    }
    release(0);  // before waiting on the gather: rank-1 may need every slot back
    if (gather) {
      for (int step = 0; step < n - 1; ++step) {
        const int block = gather_block(step);
        for (int64_t k = 0; k < layout.pieces; ++k) {
          const Piece p = layout.piece(block, k);
          if (p.len == 0) continue;
          adding_context(
              [&] {
                if (!gather->waitRecv(timeout)) throw gloo::IoException("receive aborted");
              },
              [&] {
                return fmt::format("ring all_gather step {} of {}: receiving block {} from rank {}", step + 1, n - 1,
                                   block, prev);
              });
          if (step < n - 2) send_gather(block, p);
        }
      }
      for (int64_t i = 0; i < gather_sent; ++i) {
        adding_context(
            [&] {
              if (!gather->waitSend(timeout)) throw gloo::IoException("send aborted");
            },
            [&] { return fmt::format("ring all_gather: sending to rank {}", next); });
      }
    }
    for (int64_t i = 0; i < input_sent; ++i) {
      adding_context([&] { in_send->waitSend(); }, [&] { return fmt::format("ring: sending to rank {}", next); });
    }
    for (; acks_unwaited_ > 0; --acks_unwaited_) {
      adding_context([&] { ack_send_->waitSend(); },
                     [&] { return fmt::format("ring: returning slots to rank {}", prev); });
    }
  } catch (...) {
    abandon();
    abandoned_.push_back(std::move(in_send));  // Gloo's queue may still point at it
    throw;
  }
  return bytes_sent;
}

int64_t Ring::reduce_scatter(DType dtype, ReduceOp op, const void* input, void* output,
                             const std::vector<int64_t>& counts) {
  DTR_INTERNAL_ASSERT(static_cast<int>(counts.size()) == n_, "{} counts for {} ranks", counts.size(), n_);
  return dispatch_wire(dtype, [&]<class T>(TypeTag<T>) -> int64_t {
    const T* in = static_cast<const T*>(input);
    T* out = static_cast<T*>(output);
    if (n_ == 1) {  // the sum over one rank is its own block; avg divides by 1
      if (out != in) std::memcpy(out, in, counts[0] * sizeof(T));
      return 0;
    }
    return run<T>(op, in, out, counts, nullptr);
  });
}

int64_t Ring::all_reduce(DType dtype, ReduceOp op, void* data, const std::vector<int64_t>& counts, uint32_t tag) {
  DTR_INTERNAL_ASSERT(static_cast<int>(counts.size()) == n_, "{} counts for {} ranks", counts.size(), n_);
  if (n_ == 1) return 0;  // the reduction over one rank is its own data; avg divides by 1
  return dispatch_wire(dtype, [&]<class T>(TypeTag<T>) -> int64_t {
    T* p = static_cast<T*>(data);
    T* mine = p + std::accumulate(counts.begin(), counts.begin() + rank_, int64_t{0});
    return run<T>(op, p, mine, counts, &tag);
  });
}

}  // namespace dtr::gloo_ring
