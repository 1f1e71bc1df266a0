// DTensorSpec: local chunks of every rank tile the global tensor (Replicate and Partial
// mesh dims duplicate it), for random meshes, shapes and placements; and the checks.
#include "dtensor/dtensor_spec.h"

#include <catch2/catch.hpp>

#include "core/error.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace dtr {
namespace {

using testing::MessageContains;

// Flat row-major index of every element of `chunk` within a tensor of `shape`.
std::vector<int64_t> chunk_elements(const LocalChunk& chunk, const Shape& shape) {
  std::vector<int64_t> result;
  const int64_t n = shape_numel(chunk.shape);
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rest = flat, global = 0, stride = 1;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      const int64_t local = rest % chunk.shape[d];
      rest /= chunk.shape[d];
      global += (chunk.offset[d] + local) * stride;
      stride *= shape[d];
    }
    result.push_back(global);
  }
  return result;
}

TEST_CASE("local chunks of all ranks cover every element exactly once per non-Shard copy", "[dtensor_spec]") {
  std::mt19937_64 gen(20240601);
  int64_t cases = 0, empty_shards = 0;
  for (int round = 0; round < 60; ++round) {
    for (const Shape& mesh_shape : testing::test_mesh_shapes()) {
      const DeviceMesh mesh = testing::make_mesh(mesh_shape);
      const Shape shape = testing::random_shape(gen);
      const Placements placements = testing::random_placements(gen, mesh.ndim(), shape.size(), ReduceOp::kSum);
      const DTensorSpec spec(mesh, placements, shape, kFloat32);
      INFO(spec.to_string());
      int64_t copies = 1;  // every element is held by one rank per combination of non-Shard coordinates
      for (int64_t i = 0; i < mesh.ndim(); ++i) {
        if (!placements[i].is_shard()) copies *= mesh_shape[i];
      }
      std::vector<std::vector<int64_t>> owners(shape_numel(shape));
      for (int64_t k = 0; k < mesh.size(); ++k) {
        const std::vector<int64_t> coord = mesh.coordinate_at(k);
        const LocalChunk chunk = spec.local_chunk(coord);
        REQUIRE(chunk == testing::reference_chunk(mesh_shape, placements, shape, coord));
        if (shape_numel(chunk.shape) == 0) ++empty_shards;
        for (int64_t e : chunk_elements(chunk, shape)) owners[e].push_back(k);
      }
      for (size_t e = 0; e < owners.size(); ++e) {
        INFO("element " << e);
        REQUIRE(static_cast<int64_t>(owners[e].size()) == copies);
        // The owners differ exactly on the non-Shard mesh dims: they agree on every Shard one.
        for (int64_t k : owners[e]) {
          for (int64_t i = 0; i < mesh.ndim(); ++i) {
            if (placements[i].is_shard()) {
              CHECK(mesh.coordinate_at(k)[i] == mesh.coordinate_at(owners[e].front())[i]);
            }
          }
        }
      }
      ++cases;
    }
  }
  CHECK(cases == 540);
  CHECK(empty_shards > 0);  // the sweep includes dims smaller than their mesh dim
}

TEST_CASE("local shape, offset and this process's chunk", "[dtensor_spec]") {
  const DeviceMesh mesh = DeviceMesh::row_major(kCPU, {2, 2}, {"dp", "tp"}, 3, 4);
  const DTensorSpec spec(mesh, {Shard(0), Shard(-1)}, {5, 3}, kBFloat16);
  CHECK(spec.placements() == Placements{Shard(0), Shard(1)});  // negative dims are wrapped
  CHECK(spec.local_chunk() == LocalChunk{{3, 2}, {2, 1}});
  CHECK(spec.local_shape(std::vector<int64_t>{0, 0}) == Shape{3, 2});
  CHECK(spec.local_offset(std::vector<int64_t>{0, 1}) == Shape{0, 2});
  CHECK(spec.mesh_dims_sharding(0) == std::vector<int64_t>{0});
  CHECK(spec.mesh_dims_sharding(1) == std::vector<int64_t>{1});
  CHECK_FALSE(spec.has_partial());
  CHECK(spec.with_placements({Replicate(), Partial()}).has_partial());
  CHECK(spec.to_string() ==
        "bfloat16[5, 3] (S(0), S(1)) on DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))");
  CHECK(spec == DTensorSpec(testing::make_mesh({2, 2}, {"dp", "tp"}), {Shard(0), Shard(1)}, {5, 3}, kBFloat16));
  CHECK_FALSE(spec == spec.with_placements({Shard(1), Shard(0)}));
}

TEST_CASE("spec checks name the tensor, mesh and placements, and say what is legal", "[dtensor_spec][errors]") {
  const DeviceMesh mesh = testing::make_mesh({2, 2}, {"dp", "tp"});
  CHECK_THROWS_MATCHES(DTensorSpec(mesh, {Shard(0), Shard(2)}, {4, 4}, kFloat32), IndexError,
                       MessageContains("Shard(dim=2) on mesh dim 1 (tp)") && MessageContains("(S(0), S(2))") &&
                           MessageContains("float32[4, 4]") && MessageContains("in [-2, 1]"));
  CHECK_THROWS_MATCHES(DTensorSpec(mesh, {Shard(-3), Replicate()}, {4, 4}, kFloat32), IndexError,
                       MessageContains("Shard(dim=-3)"));
  CHECK_THROWS_MATCHES(DTensorSpec(mesh, {Shard(0)}, {4, 4}, kFloat32), ValueError,
                       MessageContains("1 placements (S(0)) for the 2-d mesh DeviceMesh('cpu', [[0, 1], [2, 3]]") &&
                           MessageContains("one placement per mesh dim"));
  CHECK_THROWS_MATCHES(DTensorSpec(mesh, {Replicate(), Replicate(), Replicate()}, {4}, kFloat32), ValueError,
                       MessageContains("3 placements"));
  CHECK_THROWS_MATCHES(DTensorSpec(mesh, {Replicate(), Replicate()}, {4, -1}, kFloat32), ValueError,
                       MessageContains("[4, -1]"));
  CHECK_THROWS_MATCHES(DTensorSpec(mesh, {Partial(ReduceOp::kSum), Partial(ReduceOp::kMax)}, {4}, kFloat32), ValueError,
                       MessageContains("(P(sum), P(max))") && MessageContains("do not commute"));
  // Commuting mixes are legal.
  CHECK_NOTHROW(DTensorSpec(mesh, {Partial(ReduceOp::kSum), Partial(ReduceOp::kAvg)}, {4}, kFloat32));
  CHECK_NOTHROW(DTensorSpec(mesh, {Partial(ReduceOp::kMax), Partial(ReduceOp::kMax)}, {4}, kFloat32));
  CHECK_THROWS_MATCHES(DTensorSpec(mesh, {Shard(0), Shard(0)}, {4}, kFloat32).local_chunk(std::vector<int64_t>{2, 0}),
                       IndexError, MessageContains("outside the mesh"));
  // An integer average truncates: refused when the spec is made, not when it is reduced.
  for (DType d : {kInt32, kInt64, kBool}) {
    CHECK_THROWS_MATCHES(DTensorSpec(mesh, {Replicate(), Partial(ReduceOp::kAvg)}, {4}, d), TypeError,
                         MessageContains("Partial(avg) on mesh dim 1 (tp)") &&
                             MessageContains(fmt::format("{}[4]", dtype_name(d))) &&
                             MessageContains("Partial(avg) takes float32, float64, bfloat16 and float16"));
    CHECK_FALSE(DTensorSpec::is_valid(mesh, {Replicate(), Partial(ReduceOp::kAvg)}, {4}, d));
    CHECK_NOTHROW(DTensorSpec(mesh, {Replicate(), Partial(ReduceOp::kSum)}, {4}, d));
  }
  CHECK_NOTHROW(DTensorSpec(mesh, {Partial(ReduceOp::kAvg), Replicate()}, {4}, kBFloat16));
}

TEST_CASE("an empty shard's offset is the dim's global size, as in PyTorch", "[dtensor_spec]") {
  // compute_local_shape_and_global_offset: [2, 2] under (S(0), S(0)) on 2x2 gives rank 1
  // (coordinate (0, 1)) no row; its offset is 2, past every element, never on top of a real shard.
  const DTensorSpec nested(testing::make_mesh({2, 2}), {Shard(0), Shard(0)}, {2, 2}, kFloat32);
  CHECK(nested.local_chunk(std::vector<int64_t>{0, 0}) == LocalChunk{{0, 0}, {1, 2}});
  CHECK(nested.local_chunk(std::vector<int64_t>{0, 1}) == LocalChunk{{2, 0}, {0, 2}});
  CHECK(nested.local_chunk(std::vector<int64_t>{1, 0}) == LocalChunk{{1, 0}, {1, 2}});
  CHECK(nested.local_chunk(std::vector<int64_t>{1, 1}) == LocalChunk{{2, 0}, {0, 2}});
  // 1-D: 2 rows over 4 ranks.
  const DTensorSpec flat(testing::make_mesh({4}), {Shard(0)}, {2}, kFloat32);
  std::vector<int64_t> offsets;
  for (int64_t r = 0; r < 4; ++r) offsets.push_back(flat.local_offset(std::vector<int64_t>{r})[0]);
  CHECK(offsets == std::vector<int64_t>{0, 1, 2, 2});
}

}  // namespace
}  // namespace dtr
