// Chunking: torch.chunk's table, a sweep against the documented rule, and nested
// sharding offsets on 2x2 and 2x3 meshes.
#include "dtensor/chunking.h"

#include <fmt/ranges.h>
#include <catch2/catch.hpp>

#include "core/error.h"
#include "dtensor/dtensor_spec.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace dtr {
namespace {

std::vector<int64_t> lengths(int64_t size, int64_t k) {
  std::vector<int64_t> result;
  for (int64_t i = 0; i < k; ++i) result.push_back(chunk_range(size, k, i).length);
  return result;
}

TEST_CASE("chunk lengths match torch.chunk's table", "[chunking]") {
  // Compared as text: g++ 12.2 with -march=native builds a braced int64 vector {a, a, a, 0}
  // as {a, a, a, a} (an SLP vectorizer bug), so the expected lists are not braced vectors.
  CHECK(fmt::format("{}", lengths(10, 4)) == "[3, 3, 3, 1]");
  CHECK(fmt::format("{}", lengths(9, 4)) == "[3, 3, 3, 0]");
  CHECK(fmt::format("{}", lengths(6, 4)) == "[2, 2, 2, 0]");
  CHECK(fmt::format("{}", lengths(5, 4)) == "[2, 2, 1, 0]");
  CHECK(fmt::format("{}", lengths(2, 4)) == "[1, 1, 0, 0]");
  CHECK(fmt::format("{}", lengths(0, 3)) == "[0, 0, 0]");
  CHECK(fmt::format("{}", lengths(0, 1)) == "[0]");
  CHECK(fmt::format("{}", lengths(8, 4)) == "[2, 2, 2, 2]");
  CHECK(fmt::format("{}", lengths(7, 1)) == "[7]");
  // Empty chunks sit at the end of the dim, never past it.
  CHECK(chunk_range(9, 4, 3) == ChunkRange{9, 0});
  CHECK(chunk_range(2, 4, 3) == ChunkRange{2, 0});
  CHECK(chunk_range(10, 4, 3) == ChunkRange{9, 1});
  CHECK(chunk_capacity(10, 4) == 3);
  CHECK(chunk_capacity(0, 4) == 0);
}

TEST_CASE("chunks tile the dim in order for awkward sizes", "[chunking]") {
  for (int64_t size : {0, 1, 7, 1023, 4097}) {
    for (int64_t k = 1; k <= 9; ++k) {
      INFO("size " << size << ", " << k << " chunks");
      const std::vector<int64_t> expected = testing::reference_chunk_lengths(size, k);
      int64_t next = 0;
      for (int64_t i = 0; i < k; ++i) {
        const ChunkRange c = chunk_range(size, k, i);
        CHECK(c.offset == next);
        CHECK(c.length == expected[i]);
        CHECK(c.length <= chunk_capacity(size, k));
        next += c.length;
      }
      CHECK(next == size);
    }
  }
}

TEST_CASE("nested sharding: mesh dim 0 chunks first, mesh dim 1 chunks each piece", "[chunking][nested]") {
  // (S(0), S(0)) on 2x2 over 7 rows: mesh dim 0 gives 0:4 and 4:7; mesh dim 1 splits
  // 4 as 2+2 and 3 as 2+1.
  const DTensorSpec s22(testing::make_mesh({2, 2}), {Shard(0), Shard(0)}, {7, 3}, kFloat32);
  const std::vector<std::pair<int64_t, int64_t>> rows22 = {{0, 2}, {2, 2}, {4, 2}, {6, 1}};
  for (int64_t k = 0; k < 4; ++k) {
    const LocalChunk chunk = s22.local_chunk(s22.mesh().coordinate_at(k));
    CHECK(chunk.offset == Shape{rows22[k].first, 0});
    CHECK(chunk.shape == Shape{rows22[k].second, 3});
  }
  // (S(0), S(0)) on 2x3 over 5 rows: 0:3 and 3:5; 3 splits 1+1+1, 2 splits 1+1+0.
  const DTensorSpec s23(testing::make_mesh({2, 3}), {Shard(0), Shard(0)}, {5}, kFloat32);
  const std::vector<std::pair<int64_t, int64_t>> rows23 = {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 0}};
  for (int64_t k = 0; k < 6; ++k) {
    const LocalChunk chunk = s23.local_chunk(s23.mesh().coordinate_at(k));
    CHECK(chunk.offset == Shape{rows23[k].first});
    CHECK(chunk.shape == Shape{rows23[k].second});
  }
  // (S(1), S(0)) on 2x3 over [5, 4]: columns from mesh dim 0, rows from mesh dim 1.
  const DTensorSpec mixed(testing::make_mesh({2, 3}), {Shard(1), Shard(0)}, {5, 4}, kFloat32);
  CHECK(mixed.local_chunk(std::vector<int64_t>{1, 2}) == LocalChunk{{4, 2}, {1, 2}});
  CHECK(mixed.local_chunk(std::vector<int64_t>{0, 1}) == LocalChunk{{2, 0}, {2, 2}});
  // Left to right: 12 rows -> 6 per mesh dim 0 chunk -> 2 each (mesh dim 1 first would give offset 4).
  const DTensorSpec left(testing::make_mesh({2, 3}), {Shard(0), Shard(0)}, {12}, kFloat32);
  CHECK(left.local_chunk(std::vector<int64_t>{0, 1}).offset == Shape{2});
}

TEST_CASE("strided rows: each rank's chunk of every block, in block order", "[chunking][strided]") {
  const auto rows = [](int64_t n, int64_t s, int64_t k, int64_t i) { return strided_rows(n, s, k, i); };
  CHECK(rows(6, 3, 2, 0) == std::vector<ChunkRange>{{0, 1}, {2, 1}, {4, 1}});
  CHECK(rows(6, 3, 2, 1) == std::vector<ChunkRange>{{1, 1}, {3, 1}, {5, 1}});
  // q, k, v of 4 rows each over 2 ranks: rows 0:2, 4:6, 8:10 and 2:4, 6:8, 10:12.
  CHECK(rows(12, 3, 2, 1) == std::vector<ChunkRange>{{2, 2}, {6, 2}, {10, 2}});
  // Uneven: 7 rows in blocks 3, 3, 1; the third block's only row goes to rank 0.
  CHECK(rows(7, 3, 2, 0) == std::vector<ChunkRange>{{0, 2}, {3, 2}, {6, 1}});
  CHECK(rows(7, 3, 2, 1) == std::vector<ChunkRange>{{2, 1}, {5, 1}});
  CHECK(strided_capacity(7, 3, 2) == 5);
  // Split factor 1 is the chunk rule.
  for (int64_t n : {0, 1, 5, 10}) {
    for (int64_t i = 0; i < 4; ++i) {
      const ChunkRange plain = chunk_range(n, 4, i);
      CHECK(rows(n, 1, 4, i) == (plain.length == 0 ? std::vector<ChunkRange>{} : std::vector<ChunkRange>{plain}));
    }
  }
  CHECK_THROWS_MATCHES(strided_rows(6, 0, 2, 0), ValueError, testing::MessageContains("split factor 0"));
}

TEST_CASE("slice_ranges narrows a list of ranges by local position", "[chunking][strided]") {
  const std::vector<ChunkRange> held = {{0, 2}, {5, 3}, {10, 1}};
  CHECK(ranges_length(held) == 6);
  CHECK(slice_ranges(held, 0, 6) == held);
  CHECK(slice_ranges(held, 1, 3) == std::vector<ChunkRange>{{1, 1}, {5, 2}});
  CHECK(slice_ranges(held, 4, 2) == std::vector<ChunkRange>{{7, 1}, {10, 1}});
  CHECK(slice_ranges(held, 6, 0).empty());
}

TEST_CASE("a chunk outside the split, or an impossible split, is the caller's error", "[chunking][errors]") {
  using testing::MessageContains;
  CHECK_THROWS_MATCHES(chunk_range(10, 4, 4), IndexError,
                       MessageContains("chunk_range: chunk 4 of a dim of length 10 split into 4 chunks") &&
                           MessageContains("from 0 to 3"));
  CHECK_THROWS_AS(chunk_range(10, 4, -1), IndexError);
  CHECK_THROWS_MATCHES(chunk_capacity(10, 0), ValueError,
                       MessageContains("length 10 into 0 chunks") && MessageContains("chunks >= 1"));
  CHECK_THROWS_AS(chunk_capacity(-1, 2), ValueError);
}

}  // namespace
}  // namespace dtr
