// Chunking: the one rule that splits a tensor dim over the ranks of a mesh dim.
//
// torch.chunk's rule: with k chunks of a dim of length n, every chunk holds
// ceil(n/k) elements except the last non-empty one, which holds the rest; ranks
// past the end hold nothing (offset clamped to n). Examples: n=10,k=4 -> 3,3,3,1;
// n=9,k=4 -> 3,3,3,0; n=5,k=4 -> 2,2,1,0; n=2,k=4 -> 1,1,0,0. Local shapes, global
// offsets and redistribute plans all call chunk_range, nothing else, so they cannot
// disagree (PyTorch's uneven-sharding bugs came from copies of the rule).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dtr {

// The elements [offset, offset + length) of a dim of length `size` that chunk `index`
// of `num_chunks` holds.
struct ChunkRange {
  int64_t offset;
  int64_t length;
  friend bool operator==(const ChunkRange&, const ChunkRange&) = default;
};

// Chunk `index` (0 <= index < num_chunks) of a dim of length size >= 0; IndexError for an
// index outside the chunks, ValueError for a negative size or num_chunks < 1.
ChunkRange chunk_range(int64_t size, int64_t num_chunks, int64_t index);

// ceil(size / num_chunks): the length of a full chunk, to which collectives pad every
// chunk so that all ranks of a group exchange equal-sized buffers. ValueError unless
// size >= 0 and num_chunks >= 1.
int64_t chunk_capacity(int64_t size, int64_t num_chunks);

// The chunks of a dim of length `size` sharded by several mesh dims in nesting order
// (sizes[0] chunks the dim, sizes[1] each of its chunks, ...), listed row-major over the
// mesh coordinates: what a collective over those mesh dims flattened into one group sees.
// None is longer than chunk_capacity(size, product of sizes), since nested ceilings
// compose (ceil(ceil(n/a)/b) = ceil(n/(ab))), but they can differ from that group's
// flat chunks: 5 over 2x2 nests as 2,1,1,1 where chunk_range gives 2,2,1,0.
std::vector<ChunkRange> nested_chunks(int64_t size, std::span<const int64_t> sizes);

// StridedShard's rule: a dim of length `size` is split into `split_factor` blocks by the
// chunk rule, each block into `num_chunks` chunks by it again; chunk `index` of every block,
// in block order, as ranges of the dim (empty ones left out). split_factor 1 is chunk_range.
// n=6, s=3, k=2: 0 -> {0:1, 2:3, 4:5}, 1 -> {1:2, 3:4, 5:6}. Errors as chunk_range's, and
// ValueError for split_factor < 1.
std::vector<ChunkRange> strided_rows(int64_t size, int64_t split_factor, int64_t num_chunks, int64_t index);

// The longest any chunk of strided_rows(size, split_factor, num_chunks, ·) is: what a
// collective pads every member's rows to.
int64_t strided_capacity(int64_t size, int64_t split_factor, int64_t num_chunks);

// The elements at local positions [begin, begin + length) of a sequence that lists the
// elements of `ranges` in order, as ranges (a narrow of a StridedShard's rows).
std::vector<ChunkRange> slice_ranges(std::span<const ChunkRange> ranges, int64_t begin, int64_t length);

// Total length of `ranges`.
int64_t ranges_length(std::span<const ChunkRange> ranges);

}  // namespace dtr
