// DTensorSpec: local chunks of every rank tile the global tensor (Replicate and Partial
// mesh dims duplicate it), for random meshes, shapes and placements; and the checks.
#include "dtensor/dtensor_spec.h"

#include <fmt/ranges.h>
#include <catch2/catch.hpp>

#include <numeric>

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

// The global indices along `dim` that the rank at `coord` holds, from the definitions alone:
// mesh dims left to right, each keeping its torch.chunk of the list so far (of every one of
// split_factor blocks of it for a StridedShard).
std::vector<int64_t> enumerate_rows(int64_t n, const Shape& mesh_shape, const Placements& placements,
                                    const std::vector<int64_t>& coord, int64_t dim) {
  std::vector<int64_t> rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  const auto torch_chunk = [](int64_t length, int64_t k, int64_t i) {
    const int64_t cap = (length + k - 1) / k, begin = std::min(length, i * cap);
    return std::pair{begin, std::min(length, begin + cap)};
  };
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].splits_dim(dim)) continue;
    const int64_t s = placements[i].split_factor(), len = static_cast<int64_t>(rows.size());
    std::vector<int64_t> kept;
    for (int64_t b = 0; b < s; ++b) {
      const auto [block_begin, block_end] = torch_chunk(len, s, b);
      const auto [begin, end] = torch_chunk(block_end - block_begin, mesh_shape[i], coord[i]);
      kept.insert(kept.end(), rows.begin() + block_begin + begin, rows.begin() + block_begin + end);
    }
    rows = std::move(kept);
  }
  return rows;
}

std::vector<int64_t> flatten(const DimRanges& ranges) {
  std::vector<int64_t> rows;
  for (const ChunkRange& r : ranges) {
    for (int64_t k = 0; k < r.length; ++k) rows.push_back(r.offset + k);
  }
  return rows;
}

TEST_CASE("StridedShard: every rank's rows against a brute-force enumeration", "[dtensor_spec][strided]") {
  std::mt19937_64 gen(35);
  int64_t cases = 0, several_ranges = 0;
  for (int round = 0; round < 40; ++round) {
    for (const Shape& mesh_shape : testing::test_mesh_shapes()) {
      const DeviceMesh mesh = testing::make_mesh(mesh_shape);
      const Shape shape = {std::uniform_int_distribution<int64_t>(0, 13)(gen),
                           std::uniform_int_distribution<int64_t>(0, 5)(gen)};
      Placements placements;
      for (int64_t i = 0; i < mesh.ndim(); ++i) {
        const int64_t kind = std::uniform_int_distribution<int64_t>(0, 3)(gen);
        const int64_t dim = std::uniform_int_distribution<int64_t>(0, 1)(gen);
        placements.push_back(kind == 0   ? Replicate()
                             : kind == 1 ? Shard(dim)
                                         : StridedShard(dim, std::uniform_int_distribution<int64_t>(2, 4)(gen)));
      }
      const DTensorSpec spec(mesh, placements, shape, kFloat32);
      INFO(spec.to_string());
      std::vector<int64_t> held(shape_numel(shape), 0);
      for (int64_t k = 0; k < mesh.size(); ++k) {
        const std::vector<int64_t> coord = mesh.coordinate_at(k);
        const std::vector<DimRanges> ranges = spec.local_ranges(coord);
        for (int64_t d = 0; d < 2; ++d) {
          INFO("coordinate " << fmt::format("{}", coord) << ", dim " << d);
          REQUIRE(flatten(ranges[d]) == enumerate_rows(shape[d], mesh_shape, placements, coord, d));
          several_ranges += ranges[d].size() > 1;
        }
        CHECK(spec.local_shape(coord) == local_shape_of(ranges));
        // The pieces tile the local tensor and name the same elements.
        int64_t local_elements = 0;
        for (const LocalPiece& piece : spec.local_pieces(coord)) {
          local_elements += shape_numel(piece.chunk.shape);
          for (int64_t e : chunk_elements(piece.chunk, shape)) ++held[e];
        }
        CHECK(local_elements == shape_numel(spec.local_shape(coord)));
      }
      // Every element is held once per combination of coordinates of the mesh dims that do
      // not split the tensor.
      int64_t copies = 1;
      for (int64_t i = 0; i < mesh.ndim(); ++i) copies *= placements[i].splits_a_dim() ? 1 : mesh_shape[i];
      for (int64_t count : held) REQUIRE(count == copies);
      ++cases;
    }
  }
  CHECK(cases == 360);
  CHECK(several_ranges > 100);
}

TEST_CASE(
    "FSDP of tensor-parallel pieces: on the tp-first view of a (dp, tp) mesh each rank holds its dp chunk of "
    "its tp rows",
    "[dtensor_spec][strided]") {
  // What fully_shard over "dp" does to a parameter tensor parallelism placed on "tp": each
  // rank's tp rows (Shard(0), or StridedShard(0, 3) for packed q, k, v), chunked over dp.
  int64_t cases = 0, mesh_order_differs = 0;
  for (int64_t dp = 1; dp <= 3; ++dp) {
    for (int64_t tp = 1; tp <= 4; ++tp) {
      for (const Placement& by_tp : {Shard(0), StridedShard(0, 3)}) {
        for (int64_t n = 0; n <= 13; ++n) {
          for (int64_t rank = 0; rank < dp * tp; ++rank) {
            const DeviceMesh mesh = DeviceMesh::row_major(kCPU, {dp, tp}, {"dp", "tp"}, rank, dp * tp);
            const std::vector<std::string> tp_dp = {"tp", "dp"};
            const DTensorSpec spec(mesh.submesh(tp_dp), {by_tp, Shard(0)}, {n}, kFloat32);
            const int64_t d = mesh.coordinate()[0], t = mesh.coordinate()[1];
            const DTensorSpec tp_only(testing::make_mesh({tp}), {by_tp}, {n}, kFloat32);
            const std::vector<int64_t> tp_rows = flatten(tp_only.local_ranges(std::vector<int64_t>{t})[0]);
            const ChunkRange mine = chunk_range(static_cast<int64_t>(tp_rows.size()), dp, d);
            const std::vector<int64_t> expected(tp_rows.begin() + mine.offset,
                                                tp_rows.begin() + mine.offset + mine.length);
            INFO(spec.to_string() << ", rank " << rank);
            REQUIRE(flatten(spec.local_ranges()[0]) == expected);
            const DTensorSpec dp_first(mesh, {Shard(0), by_tp}, {n}, kFloat32);
            mesh_order_differs += flatten(dp_first.local_ranges()[0]) != expected;
            ++cases;
          }
        }
      }
    }
  }
  CHECK(cases == 2 * 14 * (1 + 2 + 3) * (1 + 2 + 3 + 4));
  // Why the tp-first view: with dp first, nested shards give other rows (uneven sizes too).
  CHECK(mesh_order_differs > 100);
}

TEST_CASE("StridedShard: packed q, k, v rows; several ranges have pieces, not a chunk", "[dtensor_spec][strided]") {
  // in_proj_weight [3e, e], e = 4, over 2 ranks: each holds its half of q, k and v.
  const DTensorSpec packed(testing::make_mesh({2}), {StridedShard(0, 3)}, {12, 4}, kFloat32);
  const std::vector<int64_t> one = {1};
  CHECK(packed.local_ranges(one)[0] == DimRanges{{2, 2}, {6, 2}, {10, 2}});
  CHECK(packed.local_shape(one) == Shape{6, 4});
  CHECK(packed.local_pieces(one) ==
        std::vector<LocalPiece>{{{{2, 0}, {2, 4}}, {0, 0}}, {{{6, 0}, {2, 4}}, {2, 0}}, {{{10, 0}, {2, 4}}, {4, 0}}});
  CHECK(packed.has_strided_pieces());
  CHECK_THROWS_MATCHES(packed.local_chunk(one), ValueError,
                       MessageContains("holds 3 separate ranges of dim 0") && MessageContains("SS(0,3)"));
  // The rows in local order, from a whole tensor.
  Tensor full = Tensor::empty({12, 1}, kFloat32);
  for (int64_t r = 0; r < 12; ++r) full.data_ptr<float>()[r] = static_cast<float>(r);
  const Tensor mine =
      ranges_of(full, DTensorSpec(packed.mesh(), packed.placements(), {12, 1}, kFloat32).local_ranges(one))
          .contiguous();
  CHECK(std::vector<float>(mine.data_ptr<float>(), mine.data_ptr<float>() + 6) ==
        std::vector<float>{2, 3, 6, 7, 10, 11});
  // A StridedShard that leaves every rank one range is a plain chunk.
  const DTensorSpec even(testing::make_mesh({2, 2}), {StridedShard(0, 2), Shard(0)}, {8}, kFloat32);
  CHECK_FALSE(even.has_strided_pieces());
  CHECK(even.local_chunk(std::vector<int64_t>{1, 0}) == LocalChunk{{2}, {2}});
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
