#include "checkpoint/chunk_file.h"

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <bit>

#include <nlohmann/json.hpp>

#include "checkpoint/internal/crc32c.h"
#include "checkpoint/safetensors_dtype.h"
#include "checkpoint/safetensors_header.h"
#include "core/error.h"
#include "core/posix_file.h"

namespace dtr::checkpoint::internal {
namespace {

static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian; so must the host be");

constexpr std::string_view kSave = "checkpoint::save";
constexpr std::string_view kLoad = "checkpoint::load";

std::string tensor_context(const std::string& name, const SavedChunk& chunk) {
  return fmt::format("tensor '{}' (chunk at offset {} of shape {})", name, chunk.offset, chunk.shape);
}

}  // namespace

std::vector<WrittenChunk> write_chunk_file(const std::string& path, const std::vector<ChunkToWrite>& chunks,
                                           const std::function<void(int64_t)>& on_written) {
  // Largest element first (then as given): every chunk starts at a multiple of its element size.
  std::vector<size_t> order(chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return chunks[a].data.itemsize() > chunks[b].data.itemsize(); });
  std::vector<SafetensorsEntry> entries;
  std::vector<int64_t> data_begin(chunks.size());
  int64_t offset = 0;
  for (size_t i : order) {
    const Tensor& t = chunks[i].data;
    DTR_INTERNAL_ASSERT(t.device().is_cpu() && t.is_contiguous(), "chunk '{}' must be a contiguous CPU tensor",
                        chunks[i].name);
    data_begin[i] = offset;
    offset += static_cast<int64_t>(t.nbytes());
    entries.push_back({chunks[i].name, t.dtype(), t.shape(), data_begin[i], offset});
  }
  nlohmann::json sharding = nlohmann::json::object();
  for (const ChunkToWrite& c : chunks) sharding[c.name] = {{"saved_offsets", c.offset}};
  const std::string header = safetensors_header_bytes(entries, {{"DCP_SHARDING_INFO", sharding.dump()}});
  const int64_t data_start = static_cast<int64_t>(header.size());

  FileDescriptor fd = open_file(path, O_WRONLY | O_CREAT | O_EXCL, kSave);
  write_all(fd.get(), header.data(), header.size(), path, kSave);
  std::vector<WrittenChunk> written(chunks.size());
  for (size_t i : order) {
    const Tensor& t = chunks[i].data;
    WrittenChunk& w = written[i];
    w.begin = data_start + data_begin[i];
    w.end = w.begin + static_cast<int64_t>(t.nbytes());
    w.rows_per_block = rows_per_block_for(t.shape(), t.dtype());
    const int64_t rows = chunk_rows(t.shape()), row_bytes = chunk_row_bytes(t.shape(), t.dtype());
    const auto* bytes = static_cast<const uint8_t*>(t.data());
    // One pass per checksum block: checksum it while it is in cache, then write it.
    for (int64_t row = 0; row < rows; row += w.rows_per_block) {
      const size_t n = static_cast<size_t>(std::min(w.rows_per_block, rows - row) * row_bytes);
      w.crc32c.push_back(crc32c(bytes + row * row_bytes, n));
      write_all(fd.get(), bytes + row * row_bytes, n, path, kSave);
      if (on_written) on_written(static_cast<int64_t>(n));
    }
  }
  sync_and_close(std::move(fd), path, kSave);
  return written;
}

ChunkFileReader::OpenFile& ChunkFileReader::open(const std::string& file, const std::string& tensor) {
  const auto it = files_.find(file);
  if (it != files_.end()) return it->second;
  OpenFile f;
  f.path = dir_ + "/" + file;
  f.fd = open_file(f.path, O_RDONLY, fmt::format("{}, {}", kLoad, tensor));
  f.size = file_size(f.fd.get(), f.path, kLoad);
  // The header's own checks name the file; the tensor and chunk that needed it come first.
  try {
    std::array<uint8_t, 8> prefix{};
    const size_t got = read_at(f.fd.get(), prefix.data(), 8, 0, f.path, kLoad);
    const int64_t n = safetensors_header_length(std::span(prefix.data(), got), f.size, f.path);
    std::string json(static_cast<size_t>(n), '\0');
    DTR_CHECK(read_at(f.fd.get(), json.data(), json.size(), 8, f.path, kLoad) == json.size(), ValueError,
              "safetensors file '{}' ended early (changed while being read?)", f.path);
    for (const SafetensorsEntry& e : parse_safetensors_header(json, f.size - 8 - n, f.path).entries) {
      f.entries[e.name] = Entry{e.dtype, e.shape, 8 + n + e.begin, 8 + n + e.end};
    }
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: reading {}: {}", kLoad, tensor, e.what()));
  } catch (const TypeError& e) {
    throw TypeError(fmt::format("{}: reading {}: {}", kLoad, tensor, e.what()));
  }
  return files_.emplace(file, std::move(f)).first->second;
}

ChunkRows ChunkFileReader::read_rows(const std::string& name, DType dtype, const SavedChunk& chunk, int64_t row_begin,
                                     int64_t row_end) {
  const std::string tensor = tensor_context(name, chunk);
  OpenFile& f = open(chunk.file, tensor);
  const std::string where = fmt::format("{}: file '{}', {}", kLoad, f.path, tensor);
  const auto entry = f.entries.find(name);
  DTR_CHECK(entry != f.entries.end(), ValueError,
            "{}: the file's header does not list the tensor (is the file from another checkpoint?)", where);
  const Entry& e = entry->second;
  DTR_CHECK(e.dtype == dtype && e.shape == chunk.shape && e.begin == chunk.begin && e.end == chunk.end, ValueError,
            "{}: the file's header lists {} {} at bytes [{}, {}) but the metadata says {} {} at [{}, {}) (is the "
            "file from another checkpoint?)",
            where, safetensors_dtype(e.dtype), e.shape, e.begin, e.end, safetensors_dtype(dtype), chunk.shape,
            chunk.begin, chunk.end);
  const int64_t rows = chunk_rows(chunk.shape), row_bytes = chunk_row_bytes(chunk.shape, dtype);
  const int64_t per_block = chunk.rows_per_block;
  const int64_t first_block = row_begin / per_block, end_block = num_blocks(row_end, per_block);
  const int64_t first_row = first_block * per_block, last_row = std::min(rows, end_block * per_block);
  Shape shape = chunk.shape;
  if (!shape.empty()) shape[0] = last_row - first_row;
  ChunkRows out{Tensor::empty(shape, dtype, kCPU), first_row};
  auto* bytes = static_cast<uint8_t*>(out.data.data());
  const size_t want = static_cast<size_t>((last_row - first_row) * row_bytes);
  DTR_CHECK(read_at(f.fd.get(), bytes, want, chunk.begin + first_row * row_bytes, f.path, kLoad) == want, ValueError,
            "{}: the file ended early (changed while being read?)", where);
  for (int64_t b = first_block; b < end_block; ++b) {
    const int64_t r0 = b * per_block, r1 = std::min(rows, r0 + per_block);
    const uint32_t crc = crc32c(bytes + (r0 - first_row) * row_bytes, static_cast<size_t>((r1 - r0) * row_bytes));
    DTR_CHECK(crc == chunk.crc32c[b], ValueError,
              "{}: checksum mismatch in rows {}:{} of the chunk (bytes [{}, {}) of the file): CRC32C {:#010x}, "
              "expected {:#010x}; the file is corrupt",
              where, r0, r1, chunk.begin + r0 * row_bytes, chunk.begin + r1 * row_bytes, crc, chunk.crc32c[b]);
  }
  return out;
}

}  // namespace dtr::checkpoint::internal
