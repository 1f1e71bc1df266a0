// DeviceMesh: the topology of a DTensor's ranks: an n-D array of global ranks with
// optional dim names (PyTorch's DeviceMesh, without its process groups).
//
// The array is row-major: the last mesh dim varies fastest, so init over 8 ranks with
// shape (2, 4) gives [[0, 1, 2, 3], [4, 5, 6, 7]]; the groups along "tp" (dim 1) are
// {0..3} and {4..7}, along "dp" (dim 0) {0,4}, {1,5}, {2,6}, {3,7}. Sub-meshes (mesh["dp"])
// hold the ranks that share this process's coordinate on the other dims. The mesh stores
// this process's rank, so coordinate() needs no communication. init_device_mesh creates
// one process group per mesh dim and one per range of adjacent mesh dims (flattened), once,
// shared by copies and sub-meshes; a mesh built from its constructor is a topology only.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace dtr {

class ProcessGroup;

class DeviceMesh {
 public:
  // A mesh of shape `shape` over a world of world_size ranks laid out in `ranks`
  // (row-major): `ranks` must be a permutation of 0..world_size-1, one per mesh position;
  // dim_names is empty or one unique name per mesh dim; this_rank is the calling process.
  DeviceMesh(DeviceType device_type, Shape shape, std::vector<int64_t> ranks, std::vector<std::string> dim_names,
             int64_t this_rank, int64_t world_size);
  // The mesh over ranks 0..world_size-1 in order (the layout init_device_mesh uses).
  static DeviceMesh row_major(DeviceType device_type, Shape shape, std::vector<std::string> dim_names,
                              int64_t this_rank, int64_t world_size);

  DeviceType device_type() const { return device_type_; }
  // This rank's device of the mesh's type, where its tensors live (torch's DeviceMesh on the
  // current device): the CPU, or for a CUDA mesh the device its groups run on (LOCAL_RANK's,
  // as NCCL groups take it); cuda:0 for a CUDA mesh without groups.
  Device device() const;
  const Shape& shape() const { return shape_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  // Number of ranks in the mesh; size(mesh_dim): ranks along one mesh dim.
  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  int64_t size(int64_t mesh_dim) const;
  // The global ranks in row-major order; per-rank tables (plan bytes) use this order.
  const std::vector<int64_t>& ranks() const { return ranks_; }
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  // The index of a named mesh dim; ValueError listing the names if absent.
  int64_t dim_index(std::string_view name) const;
  // "1 (tp)" or "1": how messages and plans name a mesh dim.
  std::string dim_label(int64_t mesh_dim) const;

  // The rank of this process and its coordinate (mesh.get_coordinate()).
  int64_t this_rank() const { return this_rank_; }
  const std::vector<int64_t>& coordinate() const { return coordinate_; }
  // This process's index along one mesh dim (mesh.get_local_rank(mesh_dim)).
  int64_t local_rank(int64_t mesh_dim) const;

  // The coordinate of the rank at row-major position `index` (0 <= index < size()); IndexError
  // naming the mesh otherwise.
  std::vector<int64_t> coordinate_at(int64_t index) const;
  // The coordinate of a global rank; ValueError if the rank is not in this mesh.
  std::vector<int64_t> coordinate_of(int64_t rank) const;
  // The global rank at a coordinate.
  int64_t rank_at(std::span<const int64_t> coordinate) const;

  // Every group of ranks along mesh_dim (the other coordinates fixed), ordered by the
  // other coordinates row-major; each group is ordered by its coordinate on mesh_dim.
  std::vector<std::vector<int64_t>> group_ranks(int64_t mesh_dim) const;
  // The same for the mesh dims [first_dim, first_dim + num_dims) flattened into one: each
  // group is ordered row-major over those dims.
  std::vector<std::vector<int64_t>> group_ranks(int64_t first_dim, int64_t num_dims) const;
  // This process's index in its flattened group over [first_dim, first_dim + num_dims).
  int64_t flat_index(int64_t first_dim, int64_t num_dims) const;
  // The group along mesh_dim that holds this process.
  std::vector<int64_t> local_group_ranks(int64_t mesh_dim) const;

  // Sub-mesh of the named dims, in the order named, through this process's coordinate:
  // mesh["tp"] on the (2, 4) mesh above is [0, 1, 2, 3] on ranks 0..3, [4..7] on 4..7.
  // Naming every dim in another order transposes the mesh: submesh({"tp", "dp"}) of it is
  // [[0, 4], [1, 5], [2, 6], [3, 7]]. Placements nest in mesh-dim order (DTensorSpec), so a
  // transposed mesh is how a sharding by "tp" comes before one by "dp" (FSDP of the
  // tensor-parallel pieces: nn/fully_shard.h).
  DeviceMesh operator[](std::string_view dim_name) const;
  DeviceMesh submesh(std::span<const std::string> dim_names) const;
  // The mesh this one was cut from by submesh (PyTorch's root mesh), itself if it was not:
  // sub-meshes of one root share its process groups.
  const DeviceMesh& root_mesh() const { return root_ ? *root_ : *this; }

  // The process group of this process along mesh_dim; ValueError for a topology-only mesh.
  ProcessGroup& group(int64_t mesh_dim) const;
  bool has_groups() const { return !groups_.empty(); }
  // Whether a collective may run over mesh dims [first_dim, first_dim + num_dims) as one
  // group: always on a topology-only mesh (plans are pure computation), and on a mesh with
  // groups when it holds that flattened group (PyTorch's DeviceMesh._flatten).
  // init_device_mesh makes one for every range of adjacent mesh dims, once; a sub-mesh
  // keeps those whose dims stay adjacent.
  bool can_flatten(int64_t first_dim, int64_t num_dims) const;
  // The flattened group of this process (group(first_dim) when num_dims is 1); ValueError
  // when can_flatten is false or the mesh is a topology.
  ProcessGroup& flattened_group(int64_t first_dim, int64_t num_dims) const;

  // This 1-D mesh's ranks, in order, as a mesh of `shape` (PyTorch's DeviceMesh._unflatten):
  // [4] over ranks (0, 2, 4, 6) as [2, 2] gives [[0, 2], [4, 6]]. Its process groups are split
  // from this mesh's group, so the call is collective over this mesh's ranks only (each calls
  // it, in the same order). ValueError unless this mesh is 1-D with a group and shape holds
  // exactly its ranks.
  DeviceMesh unflatten(Shape shape, std::vector<std::string> dim_names) const;

  // PyTorch's repr: "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))".
  std::string to_string() const;
  // Meshes are equal when device type, shape, ranks and names agree (this_rank aside:
  // every process holds its own copy of the same mesh).
  friend bool operator==(const DeviceMesh& a, const DeviceMesh& b);

 private:
  struct Unchecked {};
  DeviceMesh(Unchecked, DeviceType device_type, Shape shape, std::vector<int64_t> ranks,
             std::vector<std::string> dim_names, int64_t this_rank);
  void check_mesh_dim(int64_t mesh_dim, std::string_view op) const;
  void check_dim_range(int64_t first_dim, int64_t num_dims, std::string_view op) const;
  // Gives this mesh (of the same ranks as `parent`, in its order) a group per mesh dim and per
  // range of adjacent dims, split from `parent`: collective over it.
  void make_groups(const std::shared_ptr<ProcessGroup>& parent);
  friend DeviceMesh init_device_mesh(DeviceType, Shape, std::vector<std::string>);

  DeviceType device_type_;
  Shape shape_;
  std::vector<int64_t> ranks_;
  std::vector<std::string> dim_names_;
  int64_t this_rank_;
  std::vector<int64_t> coordinate_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;  // one per mesh dim, or none
  // (first dim, number of dims) -> the group over that range flattened, for ranges of 2+ dims.
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<ProcessGroup>> flattened_groups_;
  std::shared_ptr<const DeviceMesh> root_;  // null for a root
};

// The mesh of `shape` over every rank of the world, row-major, with one process group per
// mesh dim (torch's init_device_mesh). Initialises the default process group from the
// environment first if needed (Gloo for kCPU, NCCL for kCUDA). Collective over the world;
// ValueError if the mesh does not hold exactly the world's ranks.
DeviceMesh init_device_mesh(DeviceType device_type, Shape shape, std::vector<std::string> dim_names = {});

// The mesh of one rank, rank 0 of a world of one, without process groups: where a tensor of
// one process lives as a DTensor (nn's default parameter mesh, the tests' reference runs).
DeviceMesh single_rank_mesh(DeviceType device_type = kCPU);

}  // namespace dtr

template <>
struct fmt::formatter<dtr::DeviceMesh> : fmt::formatter<std::string> {
  auto format(const dtr::DeviceMesh& m, format_context& ctx) const {
    return fmt::formatter<std::string>::format(m.to_string(), ctx);
  }
};
