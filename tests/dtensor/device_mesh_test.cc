// DeviceMesh: row-major layout, coordinates, mesh-dim groups, sub-meshes, and the
// construction checks.
#include "dtensor/device_mesh.h"

#include <catch2/catch.hpp>

#include "core/error.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace dtr {
namespace {

using testing::MessageContains;
using Groups = std::vector<std::vector<int64_t>>;

TEST_CASE("a 2x4 mesh is row-major: the last mesh dim varies fastest", "[device_mesh]") {
  const DeviceMesh mesh = DeviceMesh::row_major(kCPU, {2, 4}, {"dp", "tp"}, 6, 8);
  CHECK(mesh.ndim() == 2);
  CHECK(mesh.size() == 8);
  CHECK(mesh.size(0) == 2);
  CHECK(mesh.size(1) == 4);
  CHECK(mesh.this_rank() == 6);
  CHECK(mesh.coordinate() == std::vector<int64_t>{1, 2});
  CHECK(mesh.local_rank(0) == 1);
  CHECK(mesh.local_rank(1) == 2);
  CHECK(mesh.rank_at(std::vector<int64_t>{0, 3}) == 3);
  CHECK(mesh.coordinate_of(5) == std::vector<int64_t>{1, 1});
  CHECK(mesh.group_ranks(1) == Groups{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(mesh.group_ranks(0) == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(mesh.local_group_ranks(0) == std::vector<int64_t>{2, 6});
  CHECK(mesh.local_group_ranks(1) == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(mesh.dim_index("tp") == 1);
  CHECK(mesh.dim_label(0) == "0 (dp)");
  CHECK(mesh.to_string() == "DeviceMesh('cpu', [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=('dp', 'tp'))");
}

TEST_CASE("a permuted 3-D mesh: coordinates, groups and sub-meshes follow the rank array", "[device_mesh]") {
  // ranks laid out as [[[7, 6], [5, 4]], [[3, 2], [1, 0]]]
  const std::vector<int64_t> ranks = {7, 6, 5, 4, 3, 2, 1, 0};
  const DeviceMesh mesh(kCUDA, {2, 2, 2}, ranks, {"pp", "dp", "tp"}, 2, 8);
  CHECK(mesh.coordinate() == std::vector<int64_t>{1, 0, 1});
  for (int64_t index = 0; index < mesh.size(); ++index) {
    const std::vector<int64_t> coord = mesh.coordinate_at(index);
    CHECK(coord == std::vector<int64_t>{index / 4, (index / 2) % 2, index % 2});
    CHECK(mesh.rank_at(coord) == ranks[index]);
    CHECK(mesh.coordinate_of(ranks[index]) == coord);
  }
  CHECK(mesh.group_ranks(0) == Groups{{7, 3}, {6, 2}, {5, 1}, {4, 0}});
  CHECK(mesh.group_ranks(1) == Groups{{7, 5}, {6, 4}, {3, 1}, {2, 0}});
  CHECK(mesh.group_ranks(2) == Groups{{7, 6}, {5, 4}, {3, 2}, {1, 0}});
  // Adjacent mesh dims flattened: groups row-major over the range.
  CHECK(mesh.group_ranks(1, 2) == Groups{{7, 6, 5, 4}, {3, 2, 1, 0}});
  CHECK(mesh.group_ranks(0, 2) == Groups{{7, 5, 3, 1}, {6, 4, 2, 0}});
  CHECK(mesh.group_ranks(0, 3) == Groups{{7, 6, 5, 4, 3, 2, 1, 0}});
  CHECK(mesh.group_ranks(2, 1) == mesh.group_ranks(2));
  CHECK(mesh.flat_index(1, 2) == 1);
  CHECK(mesh.flat_index(0, 2) == 2);
  CHECK(mesh.flat_index(0, 3) == 5);
  CHECK(mesh.can_flatten(0, 3));  // a topology plans merges; only a mesh with groups runs them
  CHECK_THROWS_MATCHES(mesh.flattened_group(0, 2), ValueError, MessageContains("built as a topology"));
  CHECK_THROWS_AS(mesh.group_ranks(2, 2), IndexError);

  const DeviceMesh tp = mesh["tp"];
  CHECK(tp.shape() == Shape{2});
  CHECK(tp.ranks() == std::vector<int64_t>{3, 2});
  CHECK(tp.coordinate() == std::vector<int64_t>{1});
  CHECK(tp.device_type() == kCUDA);
  const std::vector<std::string> names = {"pp", "tp"};
  const DeviceMesh pp_tp = mesh.submesh(names);
  CHECK(pp_tp.shape() == Shape{2, 2});
  CHECK(pp_tp.ranks() == std::vector<int64_t>{7, 6, 3, 2});
  CHECK(pp_tp.dim_names() == names);
  CHECK(pp_tp.coordinate() == std::vector<int64_t>{1, 1});
  CHECK(pp_tp.to_string() == "DeviceMesh('cuda', [[7, 6], [3, 2]], mesh_dim_names=('pp', 'tp'))");
  CHECK(mesh["dp"].to_string() == "DeviceMesh('cuda', [2, 0], mesh_dim_names=('dp',))");
  CHECK(tp.root_mesh() == mesh);
  CHECK(pp_tp.root_mesh() == mesh);
  CHECK(mesh.root_mesh() == mesh);
}

TEST_CASE("a sub-mesh naming dims in another order is the mesh transposed, for placements that nest tp first",
          "[device_mesh]") {
  for (int64_t rank = 0; rank < 8; ++rank) {
    const DeviceMesh mesh = DeviceMesh::row_major(kCPU, {2, 4}, {"dp", "tp"}, rank, 8);
    const std::vector<std::string> tp_dp = {"tp", "dp"};
    const DeviceMesh t = mesh.submesh(tp_dp);
    CHECK(t.shape() == Shape{4, 2});
    CHECK(t.ranks() == std::vector<int64_t>{0, 4, 1, 5, 2, 6, 3, 7});
    CHECK(t.coordinate() == std::vector<int64_t>{rank % 4, rank / 4});
    CHECK(t.root_mesh() == mesh);
    // The groups along each named dim are the same rank sets as the mesh's.
    CHECK(t["tp"] == mesh["tp"]);
    CHECK(t["dp"] == mesh["dp"]);
  }
}

TEST_CASE("a mesh's device: the CPU for a CPU mesh, cuda:0 for a CUDA mesh without groups", "[device_mesh]") {
  // With groups, a CUDA mesh's device is its NCCL groups' (LOCAL_RANK's): the gpu tests.
  CHECK(DeviceMesh::row_major(kCPU, {2}, {}, 1, 2).device() == Device(kCPU));
  CHECK(DeviceMesh::row_major(kCUDA, {2, 2}, {}, 3, 4).device() == Device(kCUDA, 0));
}

TEST_CASE("every rank of the world sees the same groups and its own sub-mesh", "[device_mesh]") {
  for (int64_t rank = 0; rank < 6; ++rank) {
    const DeviceMesh mesh = DeviceMesh::row_major(kCPU, {2, 3}, {"dp", "tp"}, rank, 6);
    CHECK(mesh.group_ranks(1) == Groups{{0, 1, 2}, {3, 4, 5}});
    const DeviceMesh tp = mesh["tp"];
    const std::vector<int64_t> expected = rank < 3 ? std::vector<int64_t>{0, 1, 2} : std::vector<int64_t>{3, 4, 5};
    CHECK(tp.ranks() == expected);
    CHECK(tp.local_rank(0) == rank % 3);
    CHECK(mesh["dp"].ranks() == std::vector<int64_t>{rank % 3, rank % 3 + 3});
    CHECK(mesh == testing::make_mesh({2, 3}, {"dp", "tp"}));  // this_rank aside, the same mesh
  }
  CHECK(testing::make_mesh({2, 3}) != testing::make_mesh({3, 2}));
  CHECK(testing::make_mesh({4}) != testing::make_mesh({4}, {"dp"}));
}

TEST_CASE("mesh construction rejects meshes that do not cover the world exactly", "[device_mesh][errors]") {
  CHECK_THROWS_MATCHES(DeviceMesh::row_major(kCPU, {2, 3}, {}, 0, 8), ValueError,
                       MessageContains("shape [2, 3] has 6 positions but the world has 8 ranks"));
  CHECK_THROWS_MATCHES(DeviceMesh(kCPU, {2, 2}, {0, 1, 1, 3}, {}, 0, 4), ValueError,
                       MessageContains("[0, 1, 1, 3]") && MessageContains("permutation of 0..3") &&
                           MessageContains("rank 2 is missing"));
  CHECK_THROWS_MATCHES(DeviceMesh(kCPU, {2, 2}, {0, 1, 2, 4}, {}, 0, 4), ValueError,
                       MessageContains("permutation of 0..3"));
  CHECK_THROWS_MATCHES(DeviceMesh(kCPU, {4}, {0, 1, 2}, {}, 0, 4), ValueError, MessageContains("needs 4 ranks, got 3"));
  CHECK_THROWS_MATCHES(DeviceMesh::row_major(kCPU, {}, {}, 0, 1), ValueError, MessageContains("at least one dim"));
  CHECK_THROWS_MATCHES(DeviceMesh::row_major(kCPU, {2, 0}, {}, 0, 0), ValueError, MessageContains("[2, 0]"));
  CHECK_THROWS_MATCHES(DeviceMesh::row_major(kCPU, {2, 2}, {"dp"}, 0, 4), ValueError,
                       MessageContains("1 dim names [\"dp\"] for a 2-d mesh"));
  CHECK_THROWS_MATCHES(DeviceMesh::row_major(kCPU, {2, 2}, {"dp", "dp"}, 0, 4), ValueError,
                       MessageContains("'dp' is repeated"));
  CHECK_THROWS_MATCHES(DeviceMesh::row_major(kCPU, {2, 2}, {}, 4, 4), ValueError,
                       MessageContains("rank 4 is outside the world of 4 ranks"));
}

TEST_CASE("mesh look-ups name the mesh and what is legal", "[device_mesh][errors]") {
  const DeviceMesh mesh = testing::make_mesh({2, 2}, {"dp", "tp"});
  CHECK_THROWS_MATCHES(mesh["cp"], ValueError,
                       MessageContains("no mesh dim named 'cp'") && MessageContains("[\"dp\", \"tp\"]"));
  const std::vector<std::string> twice = {"tp", "tp"};
  CHECK_THROWS_MATCHES(mesh.submesh(twice), ValueError, MessageContains("name mesh dim 'tp' twice"));
  CHECK_THROWS_MATCHES(mesh.size(2), IndexError, MessageContains("mesh dim 2 out of range"));
  CHECK_THROWS_MATCHES(mesh.coordinate_of(9), ValueError, MessageContains("rank 9 is not in DeviceMesh('cpu'"));
  CHECK_THROWS_MATCHES(mesh.rank_at(std::vector<int64_t>{0, 2}), IndexError, MessageContains("outside a mesh"));
  // A position past the mesh is the caller's IndexError (not a dtr bug), naming the mesh and the legal range.
  for (int64_t index : {4, -1}) {
    INFO(index);
    CHECK_THROWS_MATCHES(mesh.coordinate_at(index), IndexError,
                         MessageContains(fmt::format("DeviceMesh.coordinate_at: position {} is outside "
                                                     "DeviceMesh('cpu', [[0, 1], [2, 3]]",
                                                     index)) &&
                             MessageContains("from 0 to 3"));
  }
  CHECK(mesh.coordinate_at(3) == std::vector<int64_t>{1, 1});
  CHECK_THROWS_MATCHES(testing::make_mesh({4})["dp"], ValueError, MessageContains("no mesh dim named 'dp'"));
}

}  // namespace
}  // namespace dtr
