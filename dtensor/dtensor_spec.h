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

#include "core/dtype.h"
#include "core/tensor.h"
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

// The chunk the rank at mesh `coordinate` holds of a tensor of global `shape` under
// `placements` (already validated, Shard dims non-negative). The one place chunks are made.
LocalChunk compute_local_chunk(const DeviceMesh& mesh, const Placements& placements, const Shape& shape,
                               std::span<const int64_t> coordinate);

// The part of the whole tensor `full` that `chunk` names, as a view (no copy): what the rank
// holding `chunk` keeps of it.
Tensor chunk_of(const Tensor& full, const LocalChunk& chunk);

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

  // The chunk of the rank at a mesh coordinate, and of this process.
  LocalChunk local_chunk(std::span<const int64_t> coordinate) const;
  LocalChunk local_chunk() const { return local_chunk(mesh_.coordinate()); }
  Shape local_shape(std::span<const int64_t> coordinate) const { return local_chunk(coordinate).shape; }
  Shape local_offset(std::span<const int64_t> coordinate) const { return local_chunk(coordinate).offset; }

  // The mesh dims that shard tensor dim `dim`, in nesting order (outermost first).
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
