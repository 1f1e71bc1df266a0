// Collective: one ProcessGroup call, checked and normalised for a backend: whatever the
// user passed (any shape, strided views, lists), two flat contiguous buffers of one dtype
// and per-rank counts; rank r owns counts[r] elements at offset sum(counts[0..r)).
//   all_reduce, broadcast : input and output are the same buffer
//   all_gather            : input = this rank's block; output = all blocks (in place when
//                           input already sits at this rank's offset)
//   reduce_scatter        : input = all ranks' blocks; output = this rank's reduced block
//                           (in place when output sits at this rank's offset in input)
//   all_to_all            : input block j goes to rank j; output block j comes from rank j
// pack() fills input from the user's tensors first, unpack() copies output back after.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/collective_counter.h"
#include "collectives/reduce_op.h"
#include "core/tensor.h"
#include "core/trace.h"

namespace dtr {

struct Collective {
  CollectiveKind kind = CollectiveKind::kBarrier;
  uint64_t seq = 0;         // issue order on the group, from 0
  std::string call;         // the user's call, for messages: "reduce_scatter_v"
  std::string description;  // "reduce_scatter_v #4 on group 'dp' of float32[5, 3] -> float32[2, 3] (sum)"
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  DType dtype = kFloat32;
  Tensor input;
  Tensor output;
  std::vector<int64_t> input_counts;   // reduce_scatter, all_to_all
  std::vector<int64_t> output_counts;  // all_gather, all_to_all
  std::function<void()> pack;
  std::function<void()> unpack;
  int64_t bytes = 0;  // CollectiveCounter's size of the call
  std::string group;  // the group's name, and its size
  int group_size = 1;
  std::string phase;  // the issuer's trace::CommPhase (empty unless tracing)
  std::string owner;

  // Records kind, group, group_size, seq, bytes, dtype, phase and owner on a trace span
  // (trace::Span, or cuda::DeviceSpan on a device stream).
  template <class Span>
  void trace_args(Span& span) const {
    if (!span.active()) return;
    span.arg("kind", collective_kind_name(kind));
    span.arg("group", group);
    span.arg("group_size", static_cast<int64_t>(group_size));
    span.arg("seq", static_cast<int64_t>(seq));
    span.arg("bytes", bytes);
    span.arg("dtype", dtype_name(dtype));
    if (!phase.empty()) span.arg("phase", phase);
    if (!owner.empty()) span.arg("owner", owner);
  }

  // Elements of rank r's block and where it starts, for a counts vector.
  static int64_t offset_of(const std::vector<int64_t>& counts, int rank);
};

}  // namespace dtr
