// ReduceKind: which reduction of kernels/reduce.h a reduce kernel computes (sum, mean, max,
// min, sum_of_squares), one enum for the Tensor-level ops and their CPU and CUDA kernels.
// Not the collectives' ReduceOp (collectives/reduce_op.h, PyTorch's c10d name), which says
// how ranks combine their values. No includes beyond the standard library: nvcc compiles it.
#pragma once

#include <cstdint>
#include <string_view>

namespace dtr {

enum class ReduceKind : uint8_t { kSum, kMean, kMax, kMin, kSumOfSquares };

// "sum", "mean", ...: the op's name in messages.
constexpr std::string_view reduce_kind_name(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kSum: return "sum";
    case ReduceKind::kMean: return "mean";
    case ReduceKind::kMax: return "max";
    case ReduceKind::kMin: return "min";
    case ReduceKind::kSumOfSquares: return "sum_of_squares";
  }
  return "?";
}

}  // namespace dtr
