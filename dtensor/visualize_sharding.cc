#include "dtensor/visualize_sharding.h"

#include <fmt/ranges.h>

#include "dtensor/internal/text_table.h"

namespace dtr {

std::string visualize_sharding(const DTensorSpec& spec) {
  const DeviceMesh& mesh = spec.mesh();
  // The value column's text for a partial rank, shared by every rank.
  std::string partial;
  std::vector<std::string> partial_dims;
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = spec.placements()[i];
    if (!p.is_partial()) continue;
    partial_dims.push_back(mesh.dim_label(i));
    partial += fmt::format("{}partial({})", partial.empty() ? "" : "+", reduce_op_name(p.reduce_op()));
  }
  if (!partial.empty()) {
    partial +=
        fmt::format(" term over mesh dim{} {}", partial_dims.size() == 1 ? "" : "s", fmt::join(partial_dims, ", "));
  }

  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"rank", "coord"};
  for (int64_t d = 0; d < spec.ndim(); ++d) header.push_back(fmt::format("dim {}", d));
  header.insert(header.end(), {"local shape", "value"});
  rows.push_back(std::move(header));
  for (int64_t k = 0; k < mesh.size(); ++k) {
    const std::vector<int64_t> coord = mesh.coordinate_at(k);
    const std::vector<DimRanges> ranges = spec.local_ranges(coord);
    const Shape local_shape = local_shape_of(ranges);
    std::vector<std::string> row = {fmt::format("{}", mesh.ranks()[k]), fmt::format("({})", fmt::join(coord, ", "))};
    for (const DimRanges& dim : ranges) {
      std::vector<std::string> parts;  // a StridedShard's ranges, in local order
      for (const ChunkRange& r : dim) parts.push_back(fmt::format("{}:{}", r.offset, r.offset + r.length));
      row.push_back(fmt::format("{}", fmt::join(parts, ",")));
    }
    row.push_back(fmt::format("{}", local_shape));
    row.push_back(shape_numel(local_shape) == 0 ? "empty" : partial.empty() ? "-" : partial);
    rows.push_back(std::move(row));
  }
  return spec.to_string() + "\n" + internal::format_table(rows);
}

}  // namespace dtr
