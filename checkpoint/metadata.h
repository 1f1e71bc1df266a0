// The metadata of a distributed checkpoint: what `dir/.metadata.json` holds, rank 0 writes
// last, and every rank reads first (docs/checkpoint.md has the schema).
//
// For each tensor: global shape, dtype, the mesh and placements it was saved from, and its
// chunks, which tile it exactly (no overlaps, no holes; empty shards have no chunk). A
// chunk is the rectangular piece of the tensor one rank saved (global offset and shape, a
// LocalChunk of dtensor_spec.h) stored row-major in that rank's file at an absolute byte
// range. Its bytes are rows along dim 0 (a 0-d chunk is one row), checksummed with CRC32C in
// checksum blocks of rows_per_block rows, so a reader that needs a few rows reads and
// verifies the checksum blocks holding them, not the whole chunk.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace dtr::checkpoint::internal {

inline constexpr int64_t kFormatVersion = 1;
inline constexpr std::string_view kFormatName = "dtr-checkpoint";
inline constexpr std::string_view kMetadataFile = ".metadata.json";
// A checksum block holds as many whole rows as fit in this many bytes (at least one row).
inline constexpr int64_t kChecksumBlockBytes = int64_t{1} << 20;

// The rows of a chunk of `shape`: shape[0], or 1 for a 0-d chunk.
int64_t chunk_rows(const Shape& shape);
// The bytes of one row of a chunk of `shape` (its numel / rows * itemsize).
int64_t chunk_row_bytes(const Shape& shape, DType dtype);
// The rows per checksum block a writer uses for a chunk of `shape` and `dtype`.
int64_t rows_per_block_for(const Shape& shape, DType dtype);
// ceil(rows / rows_per_block).
int64_t num_blocks(int64_t rows, int64_t rows_per_block);

struct SavedChunk {
  Shape offset;       // global offset of the chunk
  Shape shape;        // its shape (never empty: empty shards are not saved)
  std::string file;   // a file of the checkpoint directory: "__1_0.safetensors"
  int64_t begin = 0;  // its bytes are [begin, end) of the file
  int64_t end = 0;
  int64_t rows_per_block = 1;
  std::vector<uint32_t> crc32c;  // one per checksum block
};

struct SavedTensor {
  DType dtype = kFloat32;
  Shape shape;
  nlohmann::json mesh;                  // {"device_type", "shape", "ranks", "dim_names"}: informational
  std::vector<std::string> placements;  // "S(0)", "R": informational
  std::vector<SavedChunk> chunks;       // by offset
};

struct CheckpointMetadata {
  int64_t world_size = 0;
  std::map<std::string, SavedTensor> tensors;
  nlohmann::json extra;
};

// The dtype a metadata or safetensors name stands for; ValueError naming `where` otherwise.
DType dtype_from_name(std::string_view name, std::string_view where);

nlohmann::json metadata_to_json(const CheckpointMetadata& metadata);
// Parses and checks (version, dtypes, shapes whose element and byte counts fit int64, chunks
// within the tensor, byte ranges that match the chunks, one checksum per checksum block,
// chunk elements summing to the tensor's, file names without directories); every defect is
// a ValueError naming `path` and the tensor.
CheckpointMetadata metadata_from_json(const nlohmann::json& json, std::string_view path);
// Reads the file `path` (a .metadata.json) and checks it with metadata_from_json; a file that
// is not JSON is a ValueError naming it. `op` names the caller in messages.
CheckpointMetadata read_metadata_file(const std::string& path, std::string_view op);

}  // namespace dtr::checkpoint::internal
