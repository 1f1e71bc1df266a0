// Test helpers for dtensor: meshes over their own world, an independent reference for
// torch.chunk and for the chunk each rank holds, and seeded random meshes, shapes and
// placements for property tests.
#pragma once

#include <catch2/catch.hpp>

#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/device_mesh.h"
#include "dtensor/dtensor_spec.h"
#include "dtensor/placement.h"
#include "tests/testing/test_util.h"

namespace dtr::testing {

// A CPU mesh over ranks 0..size-1 in row-major order, seen from rank 0.
inline DeviceMesh make_mesh(Shape shape, std::vector<std::string> names = {}) {
  const int64_t world = shape_numel(shape);
  return DeviceMesh::row_major(kCPU, std::move(shape), std::move(names), 0, world);
}

// torch.chunk as its documentation states it: chunks of ceil(n/k) elements until the
// dim runs out, then empty chunks up to k.
inline std::vector<int64_t> reference_chunk_lengths(int64_t n, int64_t k) {
  std::vector<int64_t> lengths;
  const int64_t full = (n + k - 1) / k;
  int64_t left = n;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t take = std::min(full, left);
    lengths.push_back(take);
    left -= take;
  }
  return lengths;
}

// The chunk (offset, shape) the rank at `coord` holds: per tensor dim, each sharding mesh
// dim, left to right, takes its chunk of the piece the previous ones left.
inline LocalChunk reference_chunk(const Shape& mesh_shape, const Placements& placements, const Shape& shape,
                                  const std::vector<int64_t>& coord) {
  LocalChunk chunk{Shape(shape.size(), 0), shape};
  for (size_t d = 0; d < shape.size(); ++d) {
    for (size_t i = 0; i < placements.size(); ++i) {
      if (!placements[i].is_shard(static_cast<int64_t>(d))) continue;
      const std::vector<int64_t> lengths = reference_chunk_lengths(chunk.shape[d], mesh_shape[i]);
      chunk.offset[d] += std::accumulate(lengths.begin(), lengths.begin() + coord[i], int64_t{0});
      chunk.shape[d] = lengths[coord[i]];
      if (chunk.shape[d] == 0) chunk.offset[d] = shape[d];  // PyTorch's offset for an empty shard
    }
  }
  return chunk;
}

// The meshes the property tests draw from: 1-D of 1-4 ranks, 2-D, and a 2x2x2.
inline const std::vector<Shape>& test_mesh_shapes() {
  static const std::vector<Shape> shapes = {{1}, {2}, {3}, {4}, {2, 2}, {1, 4}, {4, 1}, {2, 3}, {2, 2, 2}};
  return shapes;
}

// A global shape of 0-3 dims with sizes 0..7 (often smaller than a mesh dim).
inline Shape random_shape(std::mt19937_64& gen) {
  const int64_t ndim = std::uniform_int_distribution<int64_t>(0, 3)(gen);
  Shape shape;
  for (int64_t d = 0; d < ndim; ++d) shape.push_back(std::uniform_int_distribution<int64_t>(0, 7)(gen));
  return shape;
}

// One placement per mesh dim: Shard(d) for d < ndim or Replicate, and Partial(op) when
// `partial` is given.
inline Placements random_placements(std::mt19937_64& gen, int64_t mesh_ndim, int64_t ndim,
                                    std::optional<ReduceOp> partial) {
  Placements result;
  const int64_t kinds = ndim + 1 + (partial ? 1 : 0);
  for (int64_t i = 0; i < mesh_ndim; ++i) {
    const int64_t pick = std::uniform_int_distribution<int64_t>(0, kinds - 1)(gen);
    if (pick < ndim) {
      result.push_back(Shard(pick));
    } else if (pick == ndim) {
      result.push_back(Replicate());
    } else {
      result.push_back(Partial(*partial));
    }
  }
  return result;
}

}  // namespace dtr::testing
