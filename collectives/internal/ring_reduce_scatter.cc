#include "collectives/internal/ring_reduce_scatter.h"

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "collectives/internal/wire_dtype.h"
#include "kernels/error.h"
#include "kernels/tensor.h"

namespace dtr::gloo_ring {
namespace {

using Clock = std::chrono::steady_clock;

// Gloo's collectives use slot prefixes 0x01..0x08; dtr's ring uses these two (the
// all-reduce's gather has its own, so its messages never match a reduce-scatter receive).
constexpr uint8_t kSlotPrefix = 0x10;
constexpr uint8_t kGatherSlotPrefix = 0x11;
constexpr int64_t kMaxPieces = 64;

struct Piece {
  int64_t start;
  int64_t len;
};

// The ring's layout for one call: block offsets, pieces per block, scratch banks, the Gloo
// slot, and the deadline every wait shares.
struct Ring {
  Ring(gloo::Context& context, const std::vector<int64_t>& block_counts, size_t elem, uint32_t tag,
       std::chrono::milliseconds timeout)
      : n(context.size),
        rank(context.rank),
        counts(block_counts),
        offsets(block_counts.size()),
        slot(gloo::Slot::build(kSlotPrefix, tag)),
        deadline(Clock::now() + timeout) {
    std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), int64_t{0});
    max_count = *std::max_element(counts.begin(), counts.end());
    pieces =
        std::clamp<int64_t>((max_count * static_cast<int64_t>(elem) + kPieceBytes - 1) / kPieceBytes, 1, kMaxPieces);
    banks = std::min(n - 1, 3);
  }

  int n, rank;
  const std::vector<int64_t>& counts;
  std::vector<int64_t> offsets;
  uint64_t slot;
  Clock::time_point deadline;
  int64_t max_count = 0;
  int64_t pieces = 1;  // per block
  int banks = 1;       // blocks of scratch: receives are posted up to two steps ahead

  Piece piece(int block, int64_t k) const {
    const int64_t c = counts[block];
    const int64_t size = (c + pieces - 1) / pieces;
    const int64_t start = std::min(c, k * size);
    return {start, std::min(c - start, size)};
  }
  int block_at_step(int s) const { return ((rank - s - 2) % n + n) % n; }
  std::chrono::milliseconds remaining() const {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  }
  void wait_recv(gloo::transport::UnboundBuffer& buf, std::string_view phase, int step, int block) const {
    try {
      if (!buf.waitRecv(remaining())) throw gloo::IoException("receive aborted");
    } catch (const gloo::Exception& e) {
      throw gloo::IoException(fmt::format("{} (ring {} step {} of {}: receiving block {} from rank {})", e.what(),
                                          phase, step + 1, n - 1, block, (rank + n - 1) % n));
    }
  }
  void wait_send(gloo::transport::UnboundBuffer& buf) const {
    try {
      if (!buf.waitSend(remaining())) throw gloo::IoException("send aborted");
    } catch (const gloo::Exception& e) {
      throw gloo::IoException(fmt::format("{} (ring: sending to rank {})", e.what(), (rank + 1) % n));
    }
  }
};

// What the ring does once each rank holds its reduced block.
enum class Then : uint8_t { kReturn, kAllGather };

// The ring reduce-scatter; with Then::kAllGather (an all-reduce in place: output is this
// rank's block of input) each reduced piece also goes on round the ring at once (NCCL's
// ring all-reduce), landing in every rank's input at its place: step s of the gather
// receives block (r-s-1) mod n and forwards it, but at the last step. Gather receives are
// posted before the reduce-scatter starts, straight into input: a rank's copy of a block
// is read before the reduced block can come back (it is part of that block's sum).
template <class T>
int64_t run(gloo::Context& context, ReduceOp op, const T* input, T* output, const std::vector<int64_t>& counts,
            uint32_t tag, std::chrono::milliseconds timeout, Tensor& scratch, Then then) {
  Ring ring(context, counts, sizeof(T), tag, timeout);
  const int n = ring.n, rank = ring.rank;
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  const int64_t total = ring.offsets[n - 1] + counts[n - 1];
  const int64_t bank_size = ring.max_count;

  const size_t scratch_bytes = static_cast<size_t>(ring.banks * bank_size) * sizeof(T);
  if (!scratch.defined() || scratch.nbytes() < scratch_bytes) {
    scratch = Tensor();  // free the old one first
    scratch = Tensor::empty({ring.banks * bank_size}, dtype_of<T>());
  }
  T* banks = static_cast<T*>(scratch.data());  // perhaps another dtype's: it is only bytes here
  auto in_buf = context.createUnboundBuffer(const_cast<T*>(input), total * sizeof(T));
  auto scratch_buf = context.createUnboundBuffer(banks, scratch_bytes);
  // The gather's sends and receives, on the same memory as in_buf but counted apart.
  auto gather_buf = then == Then::kAllGather ? context.createUnboundBuffer(const_cast<T*>(input), total * sizeof(T))
                                             : nullptr;
  const uint64_t gather_slot = gloo::Slot::build(kGatherSlotPrefix, tag);
  auto gather_block = [&](int step) { return ((rank - step - 1) % n + n) % n; };

  int64_t scratch_sent = 0, scratch_done = 0, input_sent = 0, gather_sent = 0, bytes_sent = 0;
  std::vector<int64_t> bank_sends_until(ring.banks, 0);  // scratch sends issued when the bank was last used
  auto send_gather = [&](int block, const Piece& p) {
    gather_buf->send(next, gather_slot, (ring.offsets[block] + p.start) * sizeof(T), p.len * sizeof(T));
    ++gather_sent;
    bytes_sent += p.len * sizeof(T);
  };

  auto post_recvs = [&](int step) {
    const int bank = step % ring.banks;
    for (; scratch_done < bank_sends_until[bank]; ++scratch_done) ring.wait_send(*scratch_buf);
    const int block = ring.block_at_step(step);
    for (int64_t k = 0; k < ring.pieces; ++k) {
      const Piece p = ring.piece(block, k);
      if (p.len > 0) scratch_buf->recv(prev, ring.slot, (bank * bank_size + p.start) * sizeof(T), p.len * sizeof(T));
    }
  };

  if (gather_buf) {
    for (int step = 0; step < n - 1; ++step) {
      const int block = gather_block(step);
      for (int64_t k = 0; k < ring.pieces; ++k) {
        const Piece p = ring.piece(block, k);
        if (p.len > 0) gather_buf->recv(prev, gather_slot, (ring.offsets[block] + p.start) * sizeof(T), p.len * sizeof(T));
      }
    }
  }
  post_recvs(0);
  if (n > 2) post_recvs(1);
  // Step 0 sends this rank's own copy of block rank-1.
  const int first = (rank + n - 1) % n;
  for (int64_t k = 0; k < ring.pieces; ++k) {
    const Piece p = ring.piece(first, k);
    if (p.len == 0) continue;
    in_buf->send(next, ring.slot, (ring.offsets[first] + p.start) * sizeof(T), p.len * sizeof(T));
    ++input_sent;
    bytes_sent += p.len * sizeof(T);
  }
  for (int step = 0; step < n - 1; ++step) {
    const int bank = step % ring.banks;
    const int block = ring.block_at_step(step);
    const bool last = step == n - 2;
    for (int64_t k = 0; k < ring.pieces; ++k) {
      const Piece p = ring.piece(block, k);
      if (p.len == 0) continue;
      ring.wait_recv(*scratch_buf, "reduce_scatter", step, block);
      T* got = banks + bank * bank_size + p.start;
      const T* mine = input + ring.offsets[block] + p.start;
      if (last) {
        combine(output + p.start, mine, got, p.len, op);
        if (op == ReduceOp::kAvg) divide_by(output + p.start, p.len, n);
        if (gather_buf) send_gather(block, p);
      } else {
        combine(got, got, mine, p.len, op);
        scratch_buf->send(next, ring.slot, (bank * bank_size + p.start) * sizeof(T), p.len * sizeof(T));
        ++scratch_sent;
        bytes_sent += p.len * sizeof(T);
      }
    }
    bank_sends_until[bank] = scratch_sent;
    if (step + 2 < n - 1) post_recvs(step + 2);
  }
  if (gather_buf) {
    for (int step = 0; step < n - 1; ++step) {
      const int block = gather_block(step);
      for (int64_t k = 0; k < ring.pieces; ++k) {
        const Piece p = ring.piece(block, k);
        if (p.len == 0) continue;
        ring.wait_recv(*gather_buf, "all_gather", step, block);
        if (step < n - 2) send_gather(block, p);
      }
    }
    for (int64_t i = 0; i < gather_sent; ++i) ring.wait_send(*gather_buf);
  }
  for (; scratch_done < scratch_sent; ++scratch_done) ring.wait_send(*scratch_buf);
  for (int64_t i = 0; i < input_sent; ++i) ring.wait_send(*in_buf);
  return bytes_sent;
}

}  // namespace

int64_t reduce_scatter(gloo::Context& context, DType dtype, ReduceOp op, const void* input, void* output,
                       const std::vector<int64_t>& counts, uint32_t tag, std::chrono::milliseconds timeout,
                       Tensor& scratch) {
  DTR_INTERNAL_ASSERT(static_cast<int>(counts.size()) == context.size, "{} counts for {} ranks", counts.size(),
                      context.size);
  return dispatch_wire(dtype, [&]<class T>(TypeTag<T>) -> int64_t {
    const T* in = static_cast<const T*>(input);
    T* out = static_cast<T*>(output);
    if (context.size == 1) {  // the sum over one rank is its own block; avg divides by 1
      if (out != in) std::memcpy(out, in, counts[0] * sizeof(T));
      return 0;
    }
    return run<T>(context, op, in, out, counts, tag, timeout, scratch, Then::kReturn);
  });
}

int64_t all_reduce(gloo::Context& context, DType dtype, ReduceOp op, void* data, const std::vector<int64_t>& counts,
                   uint32_t tag, std::chrono::milliseconds timeout, Tensor& scratch) {
  DTR_INTERNAL_ASSERT(static_cast<int>(counts.size()) == context.size, "{} counts for {} ranks", counts.size(),
                      context.size);
  if (context.size == 1) return 0;  // the reduction over one rank is its own data; avg divides by 1
  return dispatch_wire(dtype, [&]<class T>(TypeTag<T>) -> int64_t {
    T* p = static_cast<T*>(data);
    T* mine = p + std::accumulate(counts.begin(), counts.begin() + context.rank, int64_t{0});
    return run<T>(context, op, p, mine, counts, tag, timeout, scratch, Then::kAllGather);
  });
}

}  // namespace dtr::gloo_ring
