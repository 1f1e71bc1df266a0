// DTensorSpec: what every rank knows about a DTensor without communicating: the mesh, one
// placement per mesh dim, the global shape and the dtype (PyTorch's DTensorSpec). Every
// rank's chunk follows from it alone (chunk_range), mesh dims applied left to right: with
// [S(0), S(0)] mesh dim 0 chunks tensor dim 0, then mesh dim 1 each piece. [5, 6] on 2x2:
//   rank | coord  | rows | local shape
//   0    | (0, 0) | 0:2  | [2, 6]      (mesh dim 0 gives rows 0:3, mesh dim 1 splits 2+1)
//   1    | (0, 1) | 2:3  | [1, 6]
//   2    | (1, 0) | 3:4  | [1, 6]      (mesh dim 0 gives rows 3:5, mesh dim 1 splits 1+1)
//   3    | (1, 1) | 4:5  | [1, 6]
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "dtensor/chunking.h"
#include "dtensor/device_mesh.h"
#include "dtensor/placement.h"

namespace dtr {

// A chunk: the global indices one rank holds, [offset[d], offset[d] + shape[d]) on each dim
// (the rectangular piece a checkpoint saves, PyTorch DCP's ChunkStorageMetadata). An empty
// shard's offset is the dim's global size.
struct LocalChunk {
  Shape offset;
  Shape shape;
  friend bool operator==(const LocalChunk&, const LocalChunk&) = default;
};

// The global indices one rank holds along one dim, in the order of its local tensor: one
// range, or one per block along a dim a StridedShard splits (adjacent ranges merged). A dim
// the rank holds nothing of is {size, 0}, as an empty LocalChunk.
using DimRanges = std::vector<ChunkRange>;

// A box of the tensor a rank holds and where it sits in the rank's local tensor.
struct LocalPiece {
  LocalChunk chunk;
  Shape local_offset;
  friend bool operator==(const LocalPiece&, const LocalPiece&) = default;
};

// What the rank at mesh `coordinate` holds of a tensor of global `shape` under `placements`
// (already validated, Shard dims non-negative), dim by dim. The one place chunks are made.
std::vector<DimRanges> compute_local_ranges(const DeviceMesh& mesh, const Placements& placements, const Shape& shape,
                                            std::span<const int64_t> coordinate);
// The same as one chunk: ValueError when a StridedShard leaves the rank several ranges of a
// dim (take its pieces then).
LocalChunk compute_local_chunk(const DeviceMesh& mesh, const Placements& placements, const Shape& shape,
                               std::span<const int64_t> coordinate);
// The boxes of the ranges' product, row-major over the dims' ranges.
std::vector<LocalPiece> local_pieces(std::span<const DimRanges> ranges);
// The local shape: each dim's ranges' total length.
Shape local_shape_of(std::span<const DimRanges> ranges);

// The part of the whole tensor `full` that `chunk` names, as a view (no copy): what the rank
// holding `chunk` keeps of it.
Tensor chunk_of(const Tensor& full, const LocalChunk& chunk);
// The part of `full` that `ranges` name, in local order: a view for one range per dim, else
// a new tensor.
Tensor ranges_of(const Tensor& full, std::span<const DimRanges> ranges);

class DTensorSpec {
 public:
  // Checks one placement per mesh dim, Shard dims within the tensor's ndim (negative
  // dims are wrapped), non-negative sizes, Partial(avg) only on floating dtypes (TypeError:
  // an integer average truncates) and commuting Partial ops: Partial on several mesh dims
  // takes any mix of sum and avg, or one of max/min alone (otherwise the value would depend
  // on the reduction order).
  DTensorSpec(DeviceMesh mesh, Placements placements, Shape shape, DType dtype);
  // Whether the constructor would accept these (a query: it builds no message).
  static bool is_valid(const DeviceMesh& mesh, const Placements& placements, const Shape& shape, DType dtype);

  const DeviceMesh& mesh() const { return mesh_; }
  const Placements& placements() const { return placements_; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  // The same tensor under other placements (validated like the constructor).
  DTensorSpec with_placements(Placements placements) const;

  // What the rank at a mesh coordinate holds, and this process: its ranges per dim, its
  // chunk (ValueError when a StridedShard leaves it several ranges of a dim), its pieces
  // (one box per combination of ranges) and its local shape.
  std::vector<DimRanges> local_ranges(std::span<const int64_t> coordinate) const;
  std::vector<DimRanges> local_ranges() const { return local_ranges(mesh_.coordinate()); }
  LocalChunk local_chunk(std::span<const int64_t> coordinate) const;
  LocalChunk local_chunk() const { return local_chunk(mesh_.coordinate()); }
  std::vector<LocalPiece> local_pieces(std::span<const int64_t> coordinate) const {
    return dtr::local_pieces(local_ranges(coordinate));
  }
  std::vector<LocalPiece> local_pieces() const { return local_pieces(mesh_.coordinate()); }
  Shape local_shape(std::span<const int64_t> coordinate) const { return local_shape_of(local_ranges(coordinate)); }
  Shape local_shape() const { return local_shape(mesh_.coordinate()); }
  Shape local_offset(std::span<const int64_t> coordinate) const { return local_chunk(coordinate).offset; }
  // Whether some rank holds a dim in several ranges (a StridedShard that does not reduce to
  // a plain chunk): such a tensor's pieces, not its chunk, describe each rank.
  bool has_strided_pieces() const;

  // The mesh dims that shard tensor dim `dim` (Shard only), in nesting order (outermost
  // first).
  std::vector<int64_t> mesh_dims_sharding(int64_t dim) const;
  bool has_partial() const;
  // Replicate on every mesh dim: every rank holds the whole tensor.
  bool is_replicated() const;

  // "float32[8, 6] (S(0), R) on DeviceMesh('cpu', [[0, 1], [2, 3]])": for messages.
  std::string to_string() const;
  friend bool operator==(const DTensorSpec&, const DTensorSpec&) = default;

 private:
  DeviceMesh mesh_;
  Placements placements_;
  Shape shape_;
  DType dtype_;
};

}  // namespace dtr
