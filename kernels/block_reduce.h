// Layout-invariant reductions over a batch (train --deterministic; docs/deterministic.md).
//
// A sum over a batch's tokens rounds by its order, so the same global batch split over one
// rank or two gives different bits: one GEMM over all the tokens, or two over halves added
// by a reduce-scatter. While the mode is on, every such reduction sums fixed blocks (one
// sequence each) on their own and combines them in one canonical tree fixed by the blocks'
// global indices: node (level j, index k) covers blocks [k 2^j, (k + 1) 2^j), the sum of
// its two children (a node with one child is that child). A rank whose blocks are one
// aligned node (2^j of them from a multiple of 2^j) computes that node locally, and the
// ranks' nodes combine in the same tree: at two ranks one addition, which IEEE's
// commutative sum makes the same on either rank.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace dtr {

// Tokens per block (a sequence's length) while the mode is on; 0 turns it off (the default).
void set_deterministic_block_tokens(int64_t tokens);
// 0 when the mode is off.
int64_t deterministic_block_tokens();

// The canonical tree over `leaves` leaves (at least one), each leaf(i) a list of tensors of
// its own (the tree adds into them, position by position; every leaf has the same shapes,
// and a position undefined in one leaf is undefined in all and in the result).
// Holds at most log2(leaves) + 1 partial sums at once.
std::vector<Tensor> tree_sum(int64_t leaves, const std::function<std::vector<Tensor>(int64_t)>& leaf);
// The same tree over numbers (0 for none).
double tree_sum(std::span<const double> leaves);

// The rows of a reduction over the first `lead` dims of a tensor of shape `shape`, flattened,
// that one block holds while the mode is on: one sequence. A tensor of three or more dims is
// [sequences, ...] (its dim-0 entries are the blocks), a 2-D one [tokens, features] (blocks
// of deterministic_block_tokens() rows). ValueError naming `op` when the rows do not split
// into whole blocks. 0 when the mode is off.
int64_t block_rows(const Shape& shape, int64_t lead, std::string_view op);

// The reduction `reduce(first_row, rows)` computes over a range of the `rows` rows: one call
// when block_rows is 0, else one per block of block_rows rows, combined by tree_sum.
std::vector<Tensor> reduce_rows(int64_t rows, int64_t block_rows,
                                const std::function<std::vector<Tensor>(int64_t, int64_t)>& reduce);

}  // namespace dtr
