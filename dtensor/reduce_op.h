// ReduceOp: how the terms of a Partial placement combine into the global value.
//
// A rank holding a Partial(op) tensor holds one term; the tensor's value is op applied
// elementwise over the ranks of that mesh dimension. sum and avg are linear (they
// commute with each other and with any data movement); max and min are not. These are
// the ops of PyTorch's Partial that NCCL and Gloo reduce natively (Gloo's avg is sum
// followed by a division).
#pragma once

#include <cstdint>
#include <string_view>

namespace dtr {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };

// "sum", "avg", "max", "min": the names PyTorch's Partial(reduce_op=...) takes.
constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

// True for sum and avg, whose reductions over different mesh dims commute.
constexpr bool is_linear(ReduceOp op) { return op == ReduceOp::kSum || op == ReduceOp::kAvg; }

}  // namespace dtr
