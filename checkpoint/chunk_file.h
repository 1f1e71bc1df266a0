// A chunk file: one rank's part of a distributed checkpoint, `__<rank>_0.safetensors`.
//
// It is a plain .safetensors file (an 8-byte little-endian header length N, N bytes of JSON
// {"<tensor name>": {"dtype", "shape", "data_offsets"}}, padded with spaces to a multiple
// of 8, then the data), holding this rank's chunk of each tensor it writes under the
// tensor's own name, so any safetensors reader can open it; its "__metadata__" holds
// "DCP_SHARDING_INFO", {"<tensor name>": {"saved_offsets": [global offset of the chunk]}} as
// a JSON string, which PyTorch's HuggingFaceStorageReader reads to place each chunk, so
// torch.distributed.checkpoint.load reads a dtr checkpoint directory. Data is little-endian,
// row-major, largest element size first so every chunk starts aligned. The writer
// checksums each chunk in checksum blocks of rows (checkpoint_metadata.h); the reader reads
// whole checksum blocks and verifies every one it reads.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/metadata.h"
#include "core/file_descriptor.h"
#include "core/tensor.h"
#include "dtensor/dtensor_spec.h"

namespace dtr::checkpoint::internal {

struct ChunkToWrite {
  std::string name;
  Tensor data;   // the chunk's values: a contiguous CPU tensor
  Shape offset;  // the chunk's offset in the global tensor
};

struct WrittenChunk {
  int64_t begin = 0;  // absolute byte range in the file
  int64_t end = 0;
  int64_t rows_per_block = 1;
  std::vector<uint32_t> crc32c;
};

// Creates `path` (which must not exist) holding `chunks`, fsync'ed; returns where each
// chunk went and its checksums (one per checksum block), in the order of `chunks`.
// `on_written`, when set, is called with the data bytes of each checksum block once it is
// written.
std::vector<WrittenChunk> write_chunk_file(const std::string& path, const std::vector<ChunkToWrite>& chunks,
                                           const std::function<void(int64_t)>& on_written = {});

// Whole checksum blocks of a chunk, read and verified: rows [first_row, first_row + data.size(0))
// of the chunk (all of a 0-d chunk).
struct ChunkRows {
  Tensor data;
  int64_t first_row = 0;
};

// The chunk files of one checkpoint directory, each opened and its header parsed on first
// use, with checkpoint/safetensors_header.h's checks. Errors name the file, the tensor and the
// chunk: a missing file is an OSError; a file whose size is not what its header says
// (truncated), a header that does not list the chunk as the metadata does (dtype, shape,
// byte range, and the offset its DCP_SHARDING_INFO records), and a checksum block whose
// CRC32C differs (corrupt) are ValueErrors.
class ChunkFileReader {
 public:
  explicit ChunkFileReader(std::string dir) : dir_(std::move(dir)) {}

  // The checksum blocks of `chunk` of tensor `name` holding rows [row_begin, row_end).
  ChunkRows read_rows(const std::string& name, DType dtype, const SavedChunk& chunk, int64_t row_begin,
                      int64_t row_end);

  // Fills `dst`, the values of the region `wanted` of tensor `name` (a rank's chunk, or the
  // whole tensor), from the saved chunks that overlap it, reading only the checksum blocks
  // that hold the overlaps; a ValueError (corrupt metadata) unless the overlaps are pairwise
  // disjoint and cover `wanted` exactly. `on_read`, when set, gets the bytes of each overlap.
  void read_region(const std::string& name, const SavedTensor& saved, const LocalChunk& wanted, const Tensor& dst,
                   const std::function<void(int64_t)>& on_read = {});

 private:
  struct Entry {
    DType dtype;
    Shape shape;
    int64_t begin;  // absolute
    int64_t end;
    std::optional<Shape> saved_offset;  // DCP_SHARDING_INFO's, where it gives one
  };
  struct OpenFile {
    std::string path;
    FileDescriptor fd;
    int64_t size = 0;
    std::map<std::string, Entry> entries;
  };
  // `tensor` names the tensor and chunk that needs the file, for messages.
  OpenFile& open(const std::string& file, const std::string& tensor);

  std::string dir_;
  std::map<std::string, OpenFile> files_;
};

}  // namespace dtr::checkpoint::internal
