#include "dtensor/dtensor_spec.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/shape_ops.h"

namespace dtr {

namespace {

// Appends r to ranges, merged with the last range when they touch.
void append_merged(DimRanges& ranges, const ChunkRange& r) {
  if (!ranges.empty() && ranges.back().offset + ranges.back().length == r.offset) {
    ranges.back().length += r.length;
  } else {
    ranges.push_back(r);
  }
}

}  // namespace

std::vector<DimRanges> compute_local_ranges(const DeviceMesh& mesh, const Placements& placements, const Shape& shape,
                                            std::span<const int64_t> coordinate) {
  std::vector<DimRanges> ranges;
  for (int64_t size : shape) ranges.push_back({{0, size}});
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    if (!p.splits_a_dim()) continue;
    DimRanges& held = ranges[p.shard_dim()];
    DimRanges kept;
    for (const ChunkRange& rows : strided_rows(ranges_length(held), p.split_factor(), mesh.shape()[i], coordinate[i])) {
      for (const ChunkRange& r : slice_ranges(held, rows.offset, rows.length)) append_merged(kept, r);
    }
    held = std::move(kept);
  }
  // An empty dim sits at the global size (PyTorch's compute_local_shape_and_global_offset),
  // past every element, so checkpoint metadata never places it on top of a real shard.
  for (size_t d = 0; d < shape.size(); ++d) {
    if (ranges_length(ranges[d]) == 0) ranges[d] = {{shape[d], 0}};
  }
  return ranges;
}

namespace {

// `ranges` (the rank at `coordinate` holds them under the other arguments) as one chunk.
LocalChunk single_chunk(const std::vector<DimRanges>& ranges, const DeviceMesh& mesh, const Placements& placements,
                        const Shape& shape, std::span<const int64_t> coordinate) {
  LocalChunk chunk;
  for (size_t d = 0; d < ranges.size(); ++d) {
    DTR_CHECK(ranges[d].size() == 1, ValueError,
              "local chunk: under {} the rank at {} of {} holds {} separate ranges of dim {} of a {} tensor (a "
              "StridedShard); it has pieces, not one chunk",
              placements_str(placements), coordinate, mesh.to_string(), ranges[d].size(), d, shape);
    chunk.offset.push_back(ranges[d][0].offset);
    chunk.shape.push_back(ranges[d][0].length);
  }
  return chunk;
}

}  // namespace

LocalChunk compute_local_chunk(const DeviceMesh& mesh, const Placements& placements, const Shape& shape,
                               std::span<const int64_t> coordinate) {
  return single_chunk(compute_local_ranges(mesh, placements, shape, coordinate), mesh, placements, shape, coordinate);
}

std::vector<LocalPiece> local_pieces(std::span<const DimRanges> ranges) {
  std::vector<LocalPiece> pieces = {LocalPiece{}};
  for (const DimRanges& dim : ranges) {
    std::vector<LocalPiece> longer;
    for (const LocalPiece& p : pieces) {
      int64_t at = 0;
      for (const ChunkRange& r : dim) {
        LocalPiece q = p;
        q.chunk.offset.push_back(r.offset);
        q.chunk.shape.push_back(r.length);
        q.local_offset.push_back(at);
        longer.push_back(std::move(q));
        at += r.length;
      }
    }
    pieces = std::move(longer);
  }
  return pieces;
}

Shape local_shape_of(std::span<const DimRanges> ranges) {
  Shape shape;
  for (const DimRanges& r : ranges) shape.push_back(ranges_length(r));
  return shape;
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

Tensor ranges_of(const Tensor& full, std::span<const DimRanges> ranges) {
  DTR_CHECK(full.dim() == static_cast<int64_t>(ranges.size()), ValueError, "ranges_of: {}-d ranges of a {}-d tensor {}",
            ranges.size(), full.dim(), describe(full));
  Tensor part = full;
  for (size_t d = 0; d < ranges.size(); ++d) {
    const auto dim = static_cast<int64_t>(d);
    if (ranges[d].size() == 1) {
      part = part.narrow(dim, ranges[d][0].offset, ranges[d][0].length);
      continue;
    }
    std::vector<Tensor> rows;
    for (const ChunkRange& r : ranges[d]) rows.push_back(part.narrow(dim, r.offset, r.length));
    part = cat(rows, dim);
  }
  return part;
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
    if (!placements[i].splits_a_dim()) continue;
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
    if (p.splits_a_dim() && p.shard_dim() < 0) p = StridedShard(p.shard_dim() + ndim(), p.split_factor());
  }
}

DTensorSpec DTensorSpec::with_placements(Placements placements) const {
  return DTensorSpec(mesh_, std::move(placements), shape_, dtype_);
}

std::vector<DimRanges> DTensorSpec::local_ranges(std::span<const int64_t> coordinate) const {
  DTR_CHECK(static_cast<int64_t>(coordinate.size()) == mesh_.ndim(), IndexError,
            "DTensorSpec.local_ranges: coordinate {} for the {}-d mesh {}", coordinate, mesh_.ndim(),
            mesh_.to_string());
  for (int64_t i = 0; i < mesh_.ndim(); ++i) {
    DTR_CHECK(coordinate[i] >= 0 && coordinate[i] < mesh_.shape()[i], IndexError,
              "DTensorSpec.local_ranges: coordinate {} is outside the mesh of shape {}", coordinate, mesh_.shape());
  }
  return compute_local_ranges(mesh_, placements_, shape_, coordinate);
}

LocalChunk DTensorSpec::local_chunk(std::span<const int64_t> coordinate) const {
  return single_chunk(local_ranges(coordinate), mesh_, placements_, shape_, coordinate);
}

bool DTensorSpec::has_strided_pieces() const {
  if (std::none_of(placements_.begin(), placements_.end(), [](const Placement& p) { return p.is_strided_shard(); }))
    return false;
  for (int64_t k = 0; k < mesh_.size(); ++k) {
    for (const DimRanges& r : local_ranges(mesh_.coordinate_at(k))) {
      if (r.size() > 1) return true;
    }
  }
  return false;
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
