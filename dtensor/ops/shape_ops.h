// Ops that join and cut DTensors along one dim: cat, split, chunk, narrow (torch's names),
// differentiable, each with its sharding rule (PyTorch's _tensor_ops cat/split rules).
//
// Rules, per mesh dim, where `dim` is the dim joined or cut:
//   placements in              -> out                     | why exact
//   S(k), k != dim (every one) -> S(k)                    | rows of other dims stay whole
//   R                          -> R                       |
//   P(op) (every one)          -> P(op), any op           | moving elements commutes with op
//   S(dim)                     -> replicated first        | pieces cross shard boundaries
//   n equal pieces: SS(dim, n) <-> S(dim) each            | each rank's rows of piece i
//                                                           | are its chunk of piece i
// split and chunk record one autograd node for all their outputs (docs/sharding_rules.md).
#pragma once

#include <cstdint>
#include <vector>

#include "dtensor/dtensor.h"

namespace dtr {

// Joins tensors along dim. They share ndim, dtype and mesh, and sizes except along dim.
DTensor cat(const std::vector<DTensor>& tensors, int64_t dim = 0);
// Pieces of split_size along dim; the last may be smaller (a size-0 dim gives one piece).
std::vector<DTensor> split(const DTensor& x, int64_t split_size, int64_t dim = 0);
// Pieces with the given sizes along dim; they must sum to the dim's size.
std::vector<DTensor> split(const DTensor& x, const std::vector<int64_t>& split_sizes, int64_t dim = 0);
// torch.chunk: pieces of ceil(n / chunks) along dim, fewer than `chunks` when the rows run
// out (a size-0 dim gives `chunks` empty pieces).
std::vector<DTensor> chunk(const DTensor& x, int64_t chunks, int64_t dim = 0);
// Elements start..start + length - 1 along dim (IndexError outside the dim).
DTensor narrow(const DTensor& x, int64_t dim, int64_t start, int64_t length);

}  // namespace dtr
