// Ring reduce-scatter and all-reduce on Gloo's pair-level send/recv, for every group size
// and uneven blocks.
//
// Why not Gloo's own: this Gloo has only ReduceScatterHalvingDoubling, whose constructor is
// collective and binds one buffer (so it would be rebuilt per call), which was tested only
// at power-of-two sizes and which cannot do uneven blocks or avg. The ring moves the
// least data possible: in each of n-1 steps every rank sends one block (1/n of the input
// when blocks are even) to rank+1 and receives one from rank-1, so a rank sends (n-1)/n
// of its input in all, like NCCL's ring. Blocks go in pieces of about kPieceBytes, so a
// piece is reduced and forwarded while the next one is still arriving; receives are
// posted a step ahead (Gloo sends only once the receiver is ready).
// Step s (0..n-2) on rank r receives block (r-s-2) mod n, adds its own input's copy of it,
// and forwards the sum; after the last step it holds the total of block r. Types: float32,
// float64, int32, int64 (bfloat16 and float16 are widened to float32 by the caller).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "collectives/reduce_op.h"
#include "kernels/tensor.h"

namespace gloo {
class Context;
}

namespace dtr::gloo_ring {

// Bytes per piece of a block: big enough to amortise a round of Gloo's send/recv
// handshake, small enough to overlap reduction with transfer (and, in an all-reduce, the
// gather of a piece with the reduction of the next; 256 KiB pieces were slower at 4-16 MiB).
inline constexpr int64_t kPieceBytes = int64_t{1} << 20;

// output <- this rank's block of op(input of every rank). counts[r]: elements of rank r's
// block in input. output may alias this rank's block of input. avg divides the sum by n.
// scratch (up to three blocks) is kept by the caller and grown when too small, so a warm
// call allocates nothing (fresh pages of a large buffer cost more than its transfer).
// Returns the bytes this rank sent: every block but its own, once ((n-1)/n of the input
// when blocks are even). Throws gloo::Exception on a timeout or a lost peer.
int64_t reduce_scatter(gloo::Context& context, DType dtype, ReduceOp op, const void* input, void* output,
                       const std::vector<int64_t>& counts, uint32_t tag, std::chrono::milliseconds timeout,
                       Tensor& scratch);

// data <- op(data of every rank), in place: the ring reduce-scatter of data's blocks
// (counts[r] elements for rank r), each reduced piece sent on round the ring as soon as it
// is final (NCCL's ring all-reduce), so the gather overlaps the reduction. A rank sends
// 2(n-1)/n of data when blocks are even, the least an all-reduce can; returns the bytes it
// sent. Throws gloo::Exception on a timeout or a lost peer.
int64_t all_reduce(gloo::Context& context, DType dtype, ReduceOp op, void* data, const std::vector<int64_t>& counts,
                   uint32_t tag, std::chrono::milliseconds timeout, Tensor& scratch);

}  // namespace dtr::gloo_ring
