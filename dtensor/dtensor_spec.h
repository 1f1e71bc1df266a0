// DTensorSpec: what every rank knows about a DTensor without communicating: the mesh, one
// placement per mesh dim, the global shape and the dtype (PyTorch's DTensorSpec). Every
// rank's box follows from it alone (chunk_range), mesh dims applied left to right: with
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

// The global indices one rank holds: [offset[d], offset[d] + shape[d]) on each dim. An
// empty shard's offset is the dim's global size.
struct LocalBox {
  Shape offset;
  Shape shape;
  friend bool operator==(const LocalBox&, const LocalBox&) = default;
};

// The box the rank at mesh `coordinate` holds of a tensor of global `shape` under
// `placements` (already validated, Shard dims non-negative). The one place boxes are made.
LocalBox compute_local_box(const DeviceMesh& mesh, const Placements& placements, const Shape& shape,
                           std::span<const int64_t> coordinate);

// The block of the whole tensor `full` that `box` names, as a view (no copy): what the rank
// holding `box` keeps of it.
Tensor block_of(const Tensor& full, const LocalBox& box);

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

  // The box of the rank at a mesh coordinate, and of this process.
  LocalBox local_box(std::span<const int64_t> coordinate) const;
  LocalBox local_box() const { return local_box(mesh_.coordinate()); }
  Shape local_shape(std::span<const int64_t> coordinate) const { return local_box(coordinate).shape; }
  Shape local_offset(std::span<const int64_t> coordinate) const { return local_box(coordinate).offset; }

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
