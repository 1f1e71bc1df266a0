// Matrix products on DTensors: matmul, bmm and linear, differentiable, each with its
// sharding rule (PyTorch's mm/bmm strategies, generated there from the einsum mk,kn->mn).
//
// Rules per mesh dim for a [*, M, K] @ b (b [K, N], or [*, K, N] with a's leading dims):
//   S(i), R|S(i) -> S(i)     a batch dim i (b sharded with it when b has batch dims)
//   S(-2), R     -> S(-2)    rows of a give rows of out (data parallel)
//   R, S(-1)     -> S(-1)    columns of b give columns of out (column-wise TP)
//   S(-1), S(-2) -> P(sum)   each rank multiplies its slice of K: the sum is the product
//   R, R -> R; P(op), R and R, P(op) -> P(op) for op in {sum, avg}; other Partials reduced
// linear and the weight gradient's rules: docs/sharding_rules.md, "matmul".
#pragma once

#include <optional>

#include "dtensor/dtensor.h"

namespace dtr {

// a [*, M, K] @ b, b [K, N] (the leading dims of a fold into M) or [*, K, N] with a's
// leading dims (batched): [*, M, N]. Floating dtypes, equal for both; ValueError naming both
// operands and the legal shapes otherwise (no broadcasting of batch dims, no 1-D operands).
DTensor matmul(const DTensor& a, const DTensor& b);

// a [B, M, K] @ b [B, K, N] -> [B, M, N] (the 3-D case of matmul).
DTensor bmm(const DTensor& a, const DTensor& b);

// x [*, in] @ weight^T + bias, with weight [out, in] and bias [out] like torch's linear.
// The bias is added in the local product's epilogue (matmul_bias) where that is a local op
// (docs/sharding_rules.md, "matmul"), by add otherwise; the same result and gradients.
DTensor linear(const DTensor& x, const DTensor& weight, const std::optional<DTensor>& bias = std::nullopt);

}  // namespace dtr
