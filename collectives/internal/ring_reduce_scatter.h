// Ring reduce-scatter and all-reduce on Gloo's pair-level transport, for every group size,
// uneven blocks and avg, which Gloo's own reduce-scatter lacks.
//
// In each of n-1 steps every rank sends one block to rank+1 and receives one from rank-1:
// step s on rank r receives block (r-s-2) mod n, adds its own copy and forwards the sum, so
// after the last step it holds the total of block r, having sent (n-1)/n of its input (even
// blocks), like NCCL's ring. Pieces land in a pool of slots registered once with Gloo, sent
// against one credit per free slot. Types: float32, float64, int32, int64 (the caller widens
// 16-bit floats). Schedule, transport, no-deadlock argument: docs/ring_reduce_scatter.md.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>
#include <vector>

#include "collectives/reduce_op.h"
#include "core/tensor.h"

namespace gloo {
class Context;
namespace transport {
class Buffer;
}
}  // namespace gloo

namespace dtr::gloo_ring {

// Bytes per piece (and per pool slot): big enough to amortise a message, small enough to
// overlap reduction with transfer (and, in an all-reduce, the gather of a piece with the
// reduction of the next; docs/ring_reduce_scatter.md).
inline constexpr int64_t kPieceBytes = int64_t{1} << 20;
// Slots per pool: a window of 8 pieces per block streams before the ring waits for it.
inline constexpr int kSlots = 9;

// A ring's piece size and pool depth (tests take small ones, to cross many windows).
struct RingShape {
  int64_t piece_bytes = kPieceBytes;  // a positive multiple of 8
  int slots = kSlots;                 // at least 2: a window is slots-1 pieces per block
};

// This rank's end of the ring on one Gloo context: its pool (written by rank-1) and the
// credits it holds for rank+1's. Every rank of the context builds its Ring at the same
// point (it takes bound-buffer slots from the context's counter), before any rank runs one,
// and uses it from one thread at a time, in the same collective order as its peers. The
// pool's memory (slots x piece_bytes; none for one rank) is allocated once, here. Waits
// give up after the timeout the context was connected with (Gloo's bound buffers take none
// per call) with gloo::IoException naming the phase and the peer;
// a failed call closes the context's connections (the ring's credits are lost, as NCCL
// aborts a communicator), so every later call fails at once.
class Ring {
 public:
  explicit Ring(gloo::Context& context, RingShape shape = {});
  // Collects the credits rank+1 still owes (unless abandoned), so a context can outlive
  // its Ring.
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // output <- this rank's block of op(input of every rank). counts[r]: elements of rank r's
  // block in input. output may alias this rank's block of input. avg divides the sum by n.
  // Returns the bytes this rank sent: every block but its own, once ((n-1)/n of the input
  // when blocks are even).
  int64_t reduce_scatter(DType dtype, ReduceOp op, const void* input, void* output, const std::vector<int64_t>& counts);

  // data <- op(data of every rank), in place: the ring reduce-scatter of data's blocks
  // (counts[r] elements for rank r), each reduced piece sent on round the ring as soon as
  // it is final (NCCL's ring all-reduce), so the gather overlaps the reduction. The gather
  // uses Gloo's unbound buffers (it lands in place; its receives are posted before the
  // reduce-scatter starts) on slots made from tag, unique among the context's running
  // collectives. A rank sends 2(n-1)/n of data when blocks are even, the least an
  // all-reduce can; returns the bytes it sent.
  int64_t all_reduce(DType dtype, ReduceOp op, void* data, const std::vector<int64_t>& counts, uint32_t tag);

  // Closes the context's connections and marks the ring failed: its credits are lost, later
  // calls throw at once, and the destructor waits for nothing. A failed call does it; so
  // must the context's owner when another collective on it fails.
  void abandon();

 private:
  // The ring's program for one call; gather_tag null for a reduce-scatter.
  template <class T>
  int64_t run(ReduceOp op, const T* input, T* output, const std::vector<int64_t>& counts, const uint32_t* gather_tag);
  // Sends bytes of `from` at offset into rank+1's next slot, first waiting for a credit if
  // it has none (after returning every slot it can: rank+1 may be waiting for them).
  void send(gloo::transport::Buffer& from, size_t offset, size_t bytes);
  // The next piece from rank-1, in its slot of the pool, once it has arrived.
  std::byte* receive(std::string_view phase, int step, int block);
  // The slot receive() returned last is done with; Forwarded::kYes: its piece is being sent on
  // from the pool, so the slot is free once that send completes.
  enum class Forwarded : uint8_t { kNo, kYes };
  void consumed(Forwarded forwarded) { unreturned_.push_back(forwarded == Forwarded::kYes); }
  // Returns slots to rank-1, oldest first, until at most `keep` consumed slots remain.
  void release(size_t keep);

  gloo::Context& context_;
  RingShape shape_;
  int n_, rank_;
  int pool_slot_;  // bound-buffer slots: rank r's pool is pool_slot_ + r, its
                   // credits pool_slot_ + n + r
  Tensor pool_;
  std::unique_ptr<gloo::transport::Buffer> pool_recv_;  // pieces from rank-1 land here
  std::unique_ptr<gloo::transport::Buffer> pool_send_;  // forwards from the pool to rank+1
  std::unique_ptr<gloo::transport::Buffer> ack_send_;   // credits back to rank-1
  std::unique_ptr<gloo::transport::Buffer> ack_recv_;   // credits from rank+1
  char ack_out_ = 0, ack_in_ = 0;
  int64_t sent_ = 0, acked_ = 0;  // pieces sent to rank+1; credits it returned
  int64_t received_ = 0;          // pieces from rank-1
  std::deque<bool> unreturned_;   // consumed slots not yet returned, oldest first: forwarded?
  int64_t acks_unwaited_ = 0;     // returns sent this call, their sends not yet waited for
  bool broken_ = false;
  // Per-call send buffers of failed calls: Gloo's send queue of a closed pair keeps raw
  // pointers to them, so they live as long as the ring.
  std::vector<std::unique_ptr<gloo::transport::Buffer>> abandoned_;
};

}  // namespace dtr::gloo_ring
