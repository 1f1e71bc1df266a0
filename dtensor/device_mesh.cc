#include "dtensor/device_mesh.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/error.h"

namespace dtr {

namespace {

std::string_view device_type_name(DeviceType t) { return t == kCPU ? "cpu" : "cuda"; }

}  // namespace

DeviceMesh::DeviceMesh(DeviceType device_type, Shape shape, std::vector<int64_t> ranks,
                       std::vector<std::string> dim_names, int64_t this_rank, int64_t world_size) {
  DTR_CHECK(!shape.empty(), ValueError, "DeviceMesh: a mesh needs at least one dim (got shape [])");
  DTR_CHECK(std::all_of(shape.begin(), shape.end(), [](int64_t s) { return s >= 1; }), ValueError,
            "DeviceMesh: every mesh dim needs at least one rank (got shape {})", shape);
  const int64_t positions = shape_numel(shape);
  DTR_CHECK(positions == world_size, ValueError,
            "DeviceMesh: a mesh of shape {} has {} positions but the world has {} ranks; the mesh must cover "
            "the world exactly (product of the mesh shape == world size)",
            shape, positions, world_size);
  DTR_CHECK(static_cast<int64_t>(ranks.size()) == positions, ValueError,
            "DeviceMesh: a mesh of shape {} needs {} ranks, got {}: {}", shape, positions, ranks.size(), ranks);
  std::vector<int64_t> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < positions; ++i) {
    DTR_CHECK(sorted[i] == i, ValueError,
              "DeviceMesh: the ranks {} of a mesh over a world of {} must be a permutation of 0..{} (rank {} is "
              "{})",
              ranks, world_size, world_size - 1, i,
              std::count(ranks.begin(), ranks.end(), i) == 0 ? "missing" : "repeated");
  }
  DTR_CHECK(dim_names.empty() || dim_names.size() == shape.size(), ValueError,
            "DeviceMesh: {} dim names {} for a {}-d mesh of shape {}; give one name per mesh dim or none",
            dim_names.size(), dim_names, shape.size(), shape);
  for (size_t i = 0; i < dim_names.size(); ++i) {
    DTR_CHECK(!dim_names[i].empty(), ValueError, "DeviceMesh: mesh dim {} has an empty name in {}", i, dim_names);
    DTR_CHECK(std::count(dim_names.begin(), dim_names.end(), dim_names[i]) == 1, ValueError,
              "DeviceMesh: the mesh dim name '{}' is repeated in {}; names must be unique", dim_names[i], dim_names);
  }
  DTR_CHECK(this_rank >= 0 && this_rank < world_size, ValueError,
            "DeviceMesh: this process's rank {} is outside the world of {} ranks", this_rank, world_size);
  *this = DeviceMesh(Unchecked{}, device_type, std::move(shape), std::move(ranks), std::move(dim_names), this_rank);
}

DeviceMesh::DeviceMesh(Unchecked, DeviceType device_type, Shape shape, std::vector<int64_t> ranks,
                       std::vector<std::string> dim_names, int64_t this_rank)
    : device_type_(device_type),
      shape_(std::move(shape)),
      ranks_(std::move(ranks)),
      dim_names_(std::move(dim_names)),
      this_rank_(this_rank) {
  coordinate_ = coordinate_of(this_rank_);
}

DeviceMesh DeviceMesh::row_major(DeviceType device_type, Shape shape, std::vector<std::string> dim_names,
                                 int64_t this_rank, int64_t world_size) {
  std::vector<int64_t> ranks(static_cast<size_t>(std::max<int64_t>(shape_numel(shape), 0)));
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int64_t>(i);
  return DeviceMesh(device_type, std::move(shape), std::move(ranks), std::move(dim_names), this_rank, world_size);
}

void DeviceMesh::check_mesh_dim(int64_t mesh_dim, std::string_view op) const {
  DTR_CHECK(mesh_dim >= 0 && mesh_dim < ndim(), IndexError, "DeviceMesh.{}: mesh dim {} out of range for {} ({} dims)",
            op, mesh_dim, to_string(), ndim());
}

void DeviceMesh::check_dim_range(int64_t first_dim, int64_t num_dims, std::string_view op) const {
  DTR_CHECK(first_dim >= 0 && num_dims >= 1 && first_dim + num_dims <= ndim(), IndexError,
            "DeviceMesh.{}: mesh dims [{}, {}) out of range for {} ({} dims)", op, first_dim, first_dim + num_dims,
            to_string(), ndim());
}

int64_t DeviceMesh::flat_index(int64_t first_dim, int64_t num_dims) const {
  check_dim_range(first_dim, num_dims, "flat_index");
  int64_t index = 0;
  for (int64_t d = first_dim; d < first_dim + num_dims; ++d) index = index * shape_[d] + coordinate_[d];
  return index;
}

int64_t DeviceMesh::size(int64_t mesh_dim) const {
  check_mesh_dim(mesh_dim, "size");
  return shape_[mesh_dim];
}

int64_t DeviceMesh::dim_index(std::string_view name) const {
  auto it = std::find(dim_names_.begin(), dim_names_.end(), name);
  DTR_CHECK(it != dim_names_.end(), ValueError, "DeviceMesh: no mesh dim named '{}' in {} (names: {})", name,
            to_string(), dim_names_);
  return it - dim_names_.begin();
}

std::string DeviceMesh::dim_label(int64_t mesh_dim) const {
  return dim_names_.empty() ? fmt::format("{}", mesh_dim) : fmt::format("{} ({})", mesh_dim, dim_names_[mesh_dim]);
}

int64_t DeviceMesh::local_rank(int64_t mesh_dim) const {
  check_mesh_dim(mesh_dim, "local_rank");
  return coordinate_[mesh_dim];
}

std::vector<int64_t> DeviceMesh::coordinate_at(int64_t index) const {
  DTR_CHECK(index >= 0 && index < size(), IndexError,
            "DeviceMesh.coordinate_at: position {} is outside {}; positions run from 0 to {} (row-major, one per "
            "rank)",
            index, to_string(), size() - 1);
  std::vector<int64_t> coord(shape_.size());
  for (int64_t d = ndim() - 1; d >= 0; --d) {
    coord[d] = index % shape_[d];
    index /= shape_[d];
  }
  return coord;
}

std::vector<int64_t> DeviceMesh::coordinate_of(int64_t rank) const {
  auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  DTR_CHECK(it != ranks_.end(), ValueError, "DeviceMesh: rank {} is not in {}", rank, to_string());
  return coordinate_at(it - ranks_.begin());
}

int64_t DeviceMesh::rank_at(std::span<const int64_t> coordinate) const {
  DTR_CHECK(static_cast<int64_t>(coordinate.size()) == ndim(), IndexError,
            "DeviceMesh: coordinate {} has {} entries; {} needs {}", coordinate, coordinate.size(), to_string(),
            ndim());
  const Shape strides = contiguous_strides(shape_);
  int64_t index = 0;
  for (int64_t d = 0; d < ndim(); ++d) {
    DTR_CHECK(coordinate[d] >= 0 && coordinate[d] < shape_[d], IndexError,
              "DeviceMesh: coordinate {} is outside a mesh of shape {}", coordinate, shape_);
    index += coordinate[d] * strides[d];
  }
  return ranks_[index];
}

std::vector<std::vector<int64_t>> DeviceMesh::group_ranks(int64_t mesh_dim) const { return group_ranks(mesh_dim, 1); }

std::vector<std::vector<int64_t>> DeviceMesh::group_ranks(int64_t first_dim, int64_t num_dims) const {
  check_dim_range(first_dim, num_dims, "group_ranks");
  const Shape strides = contiguous_strides(shape_);
  const std::span<const int64_t> sizes = std::span(shape_).subspan(first_dim, num_dims);
  std::vector<std::vector<int64_t>> groups;
  // Positions with coordinate 0 on every dim of the range start the groups, in row-major order.
  for (int64_t index = 0; index < size(); ++index) {
    const std::vector<int64_t> coord = coordinate_at(index);
    if (std::any_of(coord.begin() + first_dim, coord.begin() + first_dim + num_dims,
                    [](int64_t c) { return c != 0; })) {
      continue;
    }
    std::vector<int64_t>& group = groups.emplace_back();
    for (int64_t member = 0; member < shape_numel(sizes); ++member) {
      int64_t position = index, rest = member;
      for (int64_t d = first_dim + num_dims - 1; d >= first_dim; --d) {
        position += rest % shape_[d] * strides[d];
        rest /= shape_[d];
      }
      group.push_back(ranks_[position]);
    }
  }
  return groups;
}

std::vector<int64_t> DeviceMesh::local_group_ranks(int64_t mesh_dim) const {
  for (std::vector<int64_t>& group : group_ranks(mesh_dim)) {
    if (std::find(group.begin(), group.end(), this_rank_) != group.end()) return group;
  }
  DTR_INTERNAL_ASSERT(false, "rank {} in no group of mesh dim {} of {}", this_rank_, mesh_dim, to_string());
  return {};
}

DeviceMesh DeviceMesh::operator[](std::string_view dim_name) const {
  const std::string name(dim_name);
  return submesh(std::span(&name, 1));
}

DeviceMesh DeviceMesh::submesh(std::span<const std::string> dim_names) const {
  DTR_CHECK(!dim_names.empty(), ValueError, "DeviceMesh.submesh: no dim names given; {} has names {}", to_string(),
            dim_names_);
  std::vector<int64_t> kept;
  for (const std::string& name : dim_names) {
    const int64_t d = dim_index(name);
    DTR_CHECK(std::find(kept.begin(), kept.end(), d) == kept.end(), ValueError,
              "DeviceMesh.submesh: names {} name mesh dim '{}' twice; give each of {} at most once", dim_names, name,
              dim_names_);
    kept.push_back(d);
  }
  Shape sub_shape;
  std::vector<std::string> sub_names;
  for (int64_t d : kept) {
    sub_shape.push_back(shape_[d]);
    sub_names.push_back(dim_names_[d]);
  }
  // Walk the kept dims row-major, holding this process's coordinate on the others.
  std::vector<int64_t> coord = coordinate_;
  std::vector<int64_t> sub_ranks;
  for (int64_t sub_index = 0; sub_index < shape_numel(sub_shape); ++sub_index) {
    int64_t rest = sub_index;
    for (int64_t k = static_cast<int64_t>(kept.size()) - 1; k >= 0; --k) {
      coord[kept[k]] = rest % sub_shape[k];
      rest /= sub_shape[k];
    }
    sub_ranks.push_back(rank_at(coord));
  }
  DeviceMesh sub(Unchecked{}, device_type_, std::move(sub_shape), std::move(sub_ranks), std::move(sub_names),
                 this_rank_);
  if (has_groups()) {
    for (int64_t d : kept) sub.groups_.push_back(groups_[d]);
    // A range of the sub-mesh's dims keeps its flattened group when they are the same
    // adjacent dims, in the same order, here.
    for (const auto& [range, group] : flattened_groups_) {
      for (size_t first = 0; first + range.second <= kept.size(); ++first) {
        bool same = true;
        for (int64_t k = 0; k < range.second; ++k) same = same && kept[first + k] == range.first + k;
        if (same) sub.flattened_groups_[{static_cast<int64_t>(first), range.second}] = group;
      }
    }
  }
  sub.root_ = root_ ? root_ : std::make_shared<const DeviceMesh>(*this);
  return sub;
}

ProcessGroup& DeviceMesh::group(int64_t mesh_dim) const {
  check_mesh_dim(mesh_dim, "group");
  DTR_CHECK(has_groups(), ValueError,
            "DeviceMesh.group: {} has no process groups (it was built as a topology); create meshes that "
            "communicate with init_device_mesh",
            to_string());
  return *groups_[mesh_dim];
}

bool DeviceMesh::can_flatten(int64_t first_dim, int64_t num_dims) const {
  check_dim_range(first_dim, num_dims, "can_flatten");
  return num_dims == 1 || !has_groups() || flattened_groups_.count({first_dim, num_dims}) == 1;
}

ProcessGroup& DeviceMesh::flattened_group(int64_t first_dim, int64_t num_dims) const {
  if (num_dims == 1) return group(first_dim);
  DTR_CHECK(can_flatten(first_dim, num_dims) && has_groups(), ValueError,
            "DeviceMesh.flattened_group: {} has no process group over mesh dims [{}, {}) ({}); flattened groups "
            "exist for adjacent mesh dims of meshes made by init_device_mesh",
            to_string(), first_dim, first_dim + num_dims,
            has_groups() ? "they were not adjacent in the mesh this one was cut from" : "it was built as a topology");
  return *flattened_groups_.at({first_dim, num_dims});
}

void DeviceMesh::make_groups(const std::shared_ptr<ProcessGroup>& parent) {
  for (int64_t m = 0; m < ndim(); ++m) {
    if (ndim() == 1) {
      groups_.push_back(parent);
      break;
    }
    // The groups along m are the ranks that agree on every other coordinate: colour by
    // the row-major index of those coordinates.
    int64_t colour = 0;
    for (int64_t k = 0; k < ndim(); ++k) {
      if (k != m) colour = colour * size(k) + coordinate()[k];
    }
    groups_.push_back(split_group(*parent, static_cast<int>(colour)));
    DTR_INTERNAL_ASSERT(groups_.back()->rank() == coordinate()[m], "group rank {} at coordinate {}",
                        groups_.back()->rank(), coordinate());
  }
  // One group per range of two or more adjacent mesh dims, for collectives merged over them.
  for (int64_t first = 0; first < ndim(); ++first) {
    for (int64_t count = 2; first + count <= ndim(); ++count) {
      if (count == ndim()) {
        flattened_groups_[{first, count}] = parent;  // row-major over every dim: the parent's order
        continue;
      }
      int64_t colour = 0;
      for (int64_t k = 0; k < ndim(); ++k) {
        if (k < first || k >= first + count) colour = colour * size(k) + coordinate()[k];
      }
      std::shared_ptr<ProcessGroup> group = split_group(*parent, static_cast<int>(colour));
      DTR_INTERNAL_ASSERT(group->rank() == flat_index(first, count), "flattened group rank {} at coordinate {}",
                          group->rank(), coordinate());
      flattened_groups_[{first, count}] = std::move(group);
    }
  }
}

DeviceMesh DeviceMesh::unflatten(Shape shape, std::vector<std::string> dim_names) const {
  DTR_CHECK(ndim() == 1 && has_groups(), ValueError,
            "DeviceMesh.unflatten: {} must be a 1-D mesh with a process group (made by init_device_mesh, or a "
            "1-D sub-mesh of one)",
            to_string());
  DTR_CHECK(shape_numel(shape) == size(), ValueError,
            "DeviceMesh.unflatten: a shape of {} holds {} ranks but {} has {}; the shape must hold exactly its ranks",
            shape, shape_numel(shape), to_string(), size());
  (void)DeviceMesh::row_major(device_type_, shape, dim_names, 0, size());  // checks the shape and names
  DeviceMesh mesh(Unchecked{}, device_type_, std::move(shape), ranks_, std::move(dim_names), this_rank_);
  mesh.make_groups(groups_.front());
  return mesh;
}

Device DeviceMesh::device() const {
  if (device_type_ == kCPU) return kCPU;
  return has_groups() ? groups_.front()->device() : Device(kCUDA, 0);
}

DeviceMesh init_device_mesh(DeviceType device_type, Shape shape, std::vector<std::string> dim_names) {
  if (!is_initialized()) init_process_group(device_type == kCPU ? Backend::kGloo : Backend::kNccl);
  std::shared_ptr<ProcessGroup> world = default_group();
  const int64_t mesh_size = shape_numel(shape);
  DTR_CHECK(mesh_size == world->size(), ValueError,
            "init_device_mesh: a mesh of shape {} holds {} ranks but the world has {}; the mesh must hold every rank",
            shape, mesh_size, world->size());
  DeviceMesh mesh =
      DeviceMesh::row_major(device_type, std::move(shape), std::move(dim_names), world->rank(), world->size());
  mesh.make_groups(world);
  return mesh;
}

DeviceMesh single_rank_mesh(DeviceType device_type) { return DeviceMesh::row_major(device_type, {1}, {}, 0, 1); }

namespace {

// Nested "[[0, 1], [2, 3]]" of ranks[begin...] for the mesh dims from `dim` on.
std::string nested_ranks(const Shape& shape, const std::vector<int64_t>& ranks, size_t dim, int64_t begin) {
  const int64_t stride = shape_numel(std::span(shape).subspan(dim + 1));
  std::vector<std::string> items;
  for (int64_t k = 0; k < shape[dim]; ++k) {
    items.push_back(dim + 1 == shape.size() ? fmt::format("{}", ranks[begin + k])
                                            : nested_ranks(shape, ranks, dim + 1, begin + k * stride));
  }
  return fmt::format("[{}]", fmt::join(items, ", "));
}

}  // namespace

std::string DeviceMesh::to_string() const {
  std::string names;
  if (!dim_names_.empty()) {
    std::vector<std::string> quoted;
    for (const std::string& n : dim_names_) quoted.push_back(fmt::format("'{}'", n));
    names = fmt::format(", mesh_dim_names=({}{})", fmt::join(quoted, ", "), quoted.size() == 1 ? "," : "");
  }
  return fmt::format("DeviceMesh('{}', {}{})", device_type_name(device_type_), nested_ranks(shape_, ranks_, 0, 0),
                     names);
}

bool operator==(const DeviceMesh& a, const DeviceMesh& b) {
  return a.device_type_ == b.device_type_ && a.shape_ == b.shape_ && a.ranks_ == b.ranks_ &&
         a.dim_names_ == b.dim_names_;
}

}  // namespace dtr
