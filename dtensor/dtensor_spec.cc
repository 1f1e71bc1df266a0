#include "dtensor/dtensor_spec.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"
#include "dtensor/chunking.h"

namespace dtr {

LocalChunk compute_local_chunk(const DeviceMesh& mesh, const Placements& placements, const Shape& shape,
                               std::span<const int64_t> coordinate) {
  LocalChunk chunk{Shape(shape.size(), 0), shape};
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_shard()) continue;
    const int64_t d = placements[i].shard_dim();
    const ChunkRange range = chunk_range(chunk.shape[d], mesh.shape()[i], coordinate[i]);
    // An empty shard sits at the global size (PyTorch's compute_local_shape_and_global_offset),
    // past every element, so checkpoint metadata never places it on top of a real shard.
    chunk.offset[d] = range.length == 0 ? shape[d] : chunk.offset[d] + range.offset;
    chunk.shape[d] = range.length;
  }
  return chunk;
}

Tensor chunk_of(const Tensor& full, const LocalChunk& chunk) {
  DTR_CHECK(full.dim() == static_cast<int64_t>(chunk.shape.size()), ValueError,
            "chunk_of: a {}-d chunk of a {}-d tensor {}", chunk.shape.size(), full.dim(), describe(full));
  Tensor view = full;
  for (size_t d = 0; d < chunk.shape.size(); ++d) {
    view = view.narrow(static_cast<int64_t>(d), chunk.offset[d], chunk.shape[d]);
  }
  return view;
}

namespace {

// What keeps (mesh, placements, shape) from being a spec.
enum class SpecDefect : uint8_t { kNone, kPlacementCount, kNegativeSize, kShardDim, kIntegerAverage, kMixedPartials };

// The first defect; for kShardDim and kIntegerAverage, *mesh_dim is the offending mesh dim.
SpecDefect find_defect(const DeviceMesh& mesh, const Placements& placements, const Shape& shape, DType dtype,
                       size_t* mesh_dim) {
  if (static_cast<int64_t>(placements.size()) != mesh.ndim()) return SpecDefect::kPlacementCount;
  if (!std::all_of(shape.begin(), shape.end(), [](int64_t s) { return s >= 0; })) return SpecDefect::kNegativeSize;
  const int64_t n = static_cast<int64_t>(shape.size());
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_shard()) continue;
    const int64_t d = placements[i].shard_dim();
    if (d < -n || d >= n) {
      *mesh_dim = i;
      return SpecDefect::kShardDim;
    }
  }
  if (!is_floating(dtype)) {
    for (size_t i = 0; i < placements.size(); ++i) {
      if (placements[i] == Partial(ReduceOp::kAvg)) {
        *mesh_dim = i;
        return SpecDefect::kIntegerAverage;
      }
    }
  }
  // Partial ops on different mesh dims must commute: all linear, or all the same op.
  std::vector<ReduceOp> ops;
  for (const Placement& p : placements) {
    if (p.is_partial()) ops.push_back(p.reduce_op());
  }
  const bool all_linear = std::all_of(ops.begin(), ops.end(), is_linear);
  const bool all_same = std::all_of(ops.begin(), ops.end(), [&](ReduceOp op) { return op == ops.front(); });
  return all_linear || all_same ? SpecDefect::kNone : SpecDefect::kMixedPartials;
}

}  // namespace

bool DTensorSpec::is_valid(const DeviceMesh& mesh, const Placements& placements, const Shape& shape, DType dtype) {
  size_t mesh_dim = 0;
  return find_defect(mesh, placements, shape, dtype, &mesh_dim) == SpecDefect::kNone;
}

DTensorSpec::DTensorSpec(DeviceMesh mesh, Placements placements, Shape shape, DType dtype)
    : mesh_(std::move(mesh)), placements_(std::move(placements)), shape_(std::move(shape)), dtype_(dtype) {
  size_t i = 0;
  switch (find_defect(mesh_, placements_, shape_, dtype_, &i)) {
    case SpecDefect::kNone: break;
    case SpecDefect::kPlacementCount:
      throw ValueError(fmt::format(
          "DTensorSpec: {} placements {} for the {}-d mesh {} of a {}{} tensor; give one placement per mesh dim",
          placements_.size(), placements_str(placements_), mesh_.ndim(), mesh_.to_string(), dtype_, shape_));
    case SpecDefect::kNegativeSize:
      throw ValueError(fmt::format("DTensorSpec: negative size in the global shape {}", shape_));
    case SpecDefect::kShardDim:
      throw IndexError(fmt::format(
          "DTensorSpec: {} on mesh dim {} of placements {} is out of range for the {}-d tensor {}{}; a Shard dim "
          "must be in [{}, {}]",
          placements_[i].repr(), mesh_.dim_label(static_cast<int64_t>(i)), placements_str(placements_), ndim(), dtype_,
          shape_, -ndim(), ndim() - 1));
    case SpecDefect::kIntegerAverage:
      throw TypeError(fmt::format(
          "DTensorSpec: Partial(avg) on mesh dim {} of placements {} for the {}{} tensor: an average of {} "
          "values truncates; Partial(avg) takes float32, float64, bfloat16 and float16; for {} use Partial(sum) "
          "and divide after reducing",
          mesh_.dim_label(static_cast<int64_t>(i)), placements_str(placements_), dtype_, shape_, dtype_, dtype_));
    case SpecDefect::kMixedPartials:
      throw ValueError(fmt::format(
          "DTensorSpec: placements {} on {} mix Partial reduce ops that do not commute, so the tensor's value "
          "would depend on the order of reduction; legal: any mix of P(sum) and P(avg), or a single one of "
          "P(max), P(min) (reduce one of them to Replicate first)",
          placements_str(placements_), mesh_.to_string()));
  }
  for (Placement& p : placements_) {
    if (p.is_shard() && p.shard_dim() < 0) p = Shard(p.shard_dim() + ndim());
  }
}

DTensorSpec DTensorSpec::with_placements(Placements placements) const {
  return DTensorSpec(mesh_, std::move(placements), shape_, dtype_);
}

LocalChunk DTensorSpec::local_chunk(std::span<const int64_t> coordinate) const {
  DTR_CHECK(static_cast<int64_t>(coordinate.size()) == mesh_.ndim(), IndexError,
            "DTensorSpec.local_chunk: coordinate {} for the {}-d mesh {}", coordinate, mesh_.ndim(), mesh_.to_string());
  for (int64_t i = 0; i < mesh_.ndim(); ++i) {
    DTR_CHECK(coordinate[i] >= 0 && coordinate[i] < mesh_.shape()[i], IndexError,
              "DTensorSpec.local_chunk: coordinate {} is outside the mesh of shape {}", coordinate, mesh_.shape());
  }
  return compute_local_chunk(mesh_, placements_, shape_, coordinate);
}

std::vector<int64_t> DTensorSpec::mesh_dims_sharding(int64_t dim) const {
  std::vector<int64_t> dims;
  for (size_t i = 0; i < placements_.size(); ++i) {
    if (placements_[i].is_shard(dim)) dims.push_back(static_cast<int64_t>(i));
  }
  return dims;
}

bool DTensorSpec::has_partial() const {
  return std::any_of(placements_.begin(), placements_.end(), [](const Placement& p) { return p.is_partial(); });
}

bool DTensorSpec::is_replicated() const {
  return std::all_of(placements_.begin(), placements_.end(), [](const Placement& p) { return p.is_replicate(); });
}

std::string DTensorSpec::to_string() const {
  return fmt::format("{}{} {} on {}", dtype_, shape_, placements_str(placements_), mesh_.to_string());
}

}  // namespace dtr
