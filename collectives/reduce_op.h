// ReduceOp: how all_reduce and reduce_scatter combine the ranks' values.
//
// avg is a true average, the sum divided by the group size, on every backend; it needs a
// floating dtype. sum, max and min work on every dtype a collective accepts. bfloat16 and
// float16 reduce in float32 on every backend path dtr owns, with one rounding at the end.
#pragma once

#include <cstdint>
#include <string_view>

namespace dtr {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };

constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

// True for sum and avg, whose reductions over different mesh dims commute (a DTensor may
// be Partial over several mesh dims only with ops that commute).
constexpr bool is_linear(ReduceOp op) { return op == ReduceOp::kSum || op == ReduceOp::kAvg; }

}  // namespace dtr
