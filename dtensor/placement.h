// Placement: what one mesh dimension does to a DTensor: Shard(dim), StridedShard(dim,
// split_factor), Replicate or Partial(op) (PyTorch's torch.distributed.tensor placement types;
// StridedShard is PyTorch's _StridedShard, with the exact rule below).
//
// Shard(d) splits tensor dim d over the mesh dim's ranks like torch.chunk: chunks of
// ceil(n/k), trailing ranks may hold fewer rows or none (chunking.h). Replicate: every rank
// holds the same values. Partial(op): every rank holds a term; the value is op over the
// ranks. A [5, 6] tensor on a 1-D mesh of 4 ranks (Replicate: all of it; Partial: a term):
//   rank | 0                 | 1                 | 2                 | 3
//   S(0) | rows 0:2, [2, 6]  | rows 2:4, [2, 6]  | rows 4:5, [1, 6]  | rows 5:5, [0, 6]
//
// StridedShard(dim, s) splits the piece of dim it receives into s blocks by the chunk rule
// and each block over the mesh dim's ranks, a rank keeping its chunk of every block, in block
// order (chunking.h's strided_rows). It is the layout of packed parameters (q, k and v in one
// [3e, e] in_proj_weight: under StridedShard(0, 3) each rank holds its heads' rows of all
// three) and of a sharding applied to an already-sharded dim. [6, 2] over 2 ranks:
//   rank | 0                         | 1
//   SS(0,3) | rows 0, 2, 4: [3, 2]   | rows 1, 3, 5: [3, 2]
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/reduce_op.h"

namespace dtr {

// An immutable value with ==, hash, a repr ("Shard(dim=0)") and a short form ("S(0)").
class Placement {
 public:
  enum class Kind : uint8_t { kShard, kStridedShard, kReplicate, kPartial };

  // Shard only: a StridedShard is not a Shard (code that splits rows by the chunk rule
  // must not take it for one).
  bool is_shard() const { return kind_ == Kind::kShard; }
  // True for Shard(dim) with exactly this dim.
  bool is_shard(int64_t dim) const { return is_shard() && dim_ == dim; }
  bool is_strided_shard() const { return kind_ == Kind::kStridedShard; }
  // Shard(dim) or StridedShard(dim, s): the mesh dim splits tensor dim `dim`.
  bool splits_dim(int64_t dim) const { return splits_a_dim() && dim_ == dim; }
  bool splits_a_dim() const { return is_shard() || is_strided_shard(); }
  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_partial() const { return kind_ == Kind::kPartial; }
  Kind kind() const { return kind_; }
  // The sharded tensor dim; ValueError naming the placement unless it is a Shard or a
  // StridedShard.
  int64_t shard_dim() const;
  // The number of blocks a StridedShard chunks separately, 1 for a Shard; ValueError for
  // the others.
  int64_t split_factor() const;
  // The reduction of the terms; ValueError naming the placement unless it is a Partial.
  ReduceOp reduce_op() const;

  // PyTorch's repr: "Shard(dim=0)", "StridedShard(dim=0, split_factor=3)", "Replicate()",
  // "Partial(sum)".
  std::string repr() const;
  // PyTorch's str: "S(0)", "SS(0,3)", "R", "P(sum)".
  std::string str() const;

  friend bool operator==(const Placement&, const Placement&) = default;
  size_t hash() const;

 private:
  friend Placement Shard(int64_t dim);
  friend Placement StridedShard(int64_t dim, int64_t split_factor);
  friend Placement Replicate();
  friend Placement Partial(ReduceOp op);
  Placement(Kind kind, int64_t dim, int64_t split_factor, ReduceOp op)
      : kind_(kind), dim_(dim), split_factor_(split_factor), op_(op) {}

  Kind kind_;
  int64_t dim_;           // 0 unless Shard or StridedShard
  int64_t split_factor_;  // 1 unless StridedShard
  ReduceOp op_;           // kSum unless Partial
};

// One placement per mesh dim, mesh dim 0 first.
using Placements = std::vector<Placement>;

// Shard tensor dim `dim` (negative dims count from the end once a spec knows the ndim).
Placement Shard(int64_t dim);
// StridedShard(dim, split_factor): split_factor 1 is Shard(dim); ValueError below 1.
Placement StridedShard(int64_t dim, int64_t split_factor);
Placement Replicate();
Placement Partial(ReduceOp op = ReduceOp::kSum);

// `placements` with every Partial made Replicate: where a Partial value goes once reduced.
Placements reduced_placements(Placements placements);

// Parses one placement: "S(0)", "S0", "Shard(dim=0)", "SS(0,3)",
// "StridedShard(dim=0, split_factor=3)", "R", "Replicate()", "P", "P(avg)", "Pavg",
// "Partial(max)". Throws ValueError naming the text and the accepted forms.
Placement parse_placement(std::string_view text);
// Parses a comma-separated list such as "S0,R" or "S(0), P(sum)".
Placements parse_placements(std::string_view text);

// "(S(0), R)": the form every error message and plan uses for a placement list.
std::string placements_str(const Placements& placements);

}  // namespace dtr

template <>
struct std::hash<dtr::Placement> {
  size_t operator()(const dtr::Placement& p) const { return p.hash(); }
};

template <>
struct fmt::formatter<dtr::Placement> : fmt::formatter<std::string> {
  auto format(const dtr::Placement& p, format_context& ctx) const {
    return fmt::formatter<std::string>::format(p.str(), ctx);
  }
};
