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

// The chunk offset a file's DCP_SHARDING_INFO ({"<tensor>": {"saved_offsets": [...]}}, parsed)
// records for tensor `name`, or none where it records none or something else.
std::optional<Shape> saved_offset(const nlohmann::json& sharding, const std::string& name) {
  if (!sharding.is_object() || !sharding.contains(name) || !sharding.at(name).is_object()) return std::nullopt;
  const nlohmann::json offsets = sharding.at(name).value("saved_offsets", nlohmann::json());
  if (!offsets.is_array()) return std::nullopt;
  Shape out;
  for (const nlohmann::json& x : offsets) {
    if (!x.is_number_integer()) return std::nullopt;
    out.push_back(x.get<int64_t>());
  }
  return out;
}

// The overlap of chunk `a` and a saved chunk at `offset` of `shape`, or none when they share
// no element.
std::optional<LocalChunk> intersect(const LocalChunk& a, const Shape& offset, const Shape& shape) {
  LocalChunk out{Shape(a.offset.size()), Shape(a.offset.size())};
  for (size_t d = 0; d < a.offset.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], offset[d]), hi = std::min(a.offset[d] + a.shape[d], offset[d] + shape[d]);
    if (hi <= lo) return std::nullopt;
    out.offset[d] = lo;
    out.shape[d] = hi - lo;
  }
  return out;
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
    const SafetensorsHeader header = parse_safetensors_header(json, f.size - 8 - n, f.path);
    const auto info = header.metadata.find("DCP_SHARDING_INFO");
    const nlohmann::json sharding = info == header.metadata.end()
                                        ? nlohmann::json()
                                        : nlohmann::json::parse(info->second, nullptr, /*allow_exceptions=*/false);
    for (const SafetensorsEntry& e : header.entries) {
      f.entries[e.name] = Entry{e.dtype, e.shape, 8 + n + e.begin, 8 + n + e.end, saved_offset(sharding, e.name)};
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
  // Files written before dtr recorded DCP_SHARDING_INFO have no offset to compare.
  DTR_CHECK(!e.saved_offset || *e.saved_offset == chunk.offset, ValueError,
            "{}: the file's header (DCP_SHARDING_INFO) says offset {} but the metadata says offset {} (corrupt "
            "metadata, or is the file from another checkpoint?)",
            where, *e.saved_offset, chunk.offset);
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

void ChunkFileReader::read_region(const std::string& name, const SavedTensor& saved, const LocalChunk& wanted,
                                  const Tensor& dst, const std::function<void(int64_t)>& on_read) {
  std::vector<LocalChunk> filled;
  int64_t covered = 0;
  for (const SavedChunk& chunk : saved.chunks) {
    const std::optional<LocalChunk> common = intersect(wanted, chunk.offset, chunk.shape);
    if (!common) continue;
    for (const LocalChunk& other : filled) {
      DTR_CHECK(!intersect(other, common->offset, common->shape), ValueError,
                "{}: '{}', tensor '{}': saved chunks overlap at offset {} (corrupt metadata)", kLoad, dir_, name,
                common->offset);
    }
    const int64_t ndim = static_cast<int64_t>(wanted.shape.size());
    // The rows of the saved chunk the overlap spans (a 0-d chunk is one row).
    const int64_t row_begin = ndim == 0 ? 0 : common->offset[0] - chunk.offset[0];
    const int64_t row_end = ndim == 0 ? 1 : row_begin + common->shape[0];
    ChunkRows rows = read_rows(name, saved.dtype, chunk, row_begin, row_end);
    Tensor src = rows.data, part = dst;
    for (int64_t d = 0; d < ndim; ++d) {
      const int64_t src_start = common->offset[d] - chunk.offset[d] - (d == 0 ? rows.first_row : 0);
      src = src.narrow(d, src_start, common->shape[d]);
      part = part.narrow(d, common->offset[d] - wanted.offset[d], common->shape[d]);
    }
    part.copy_(src);
    filled.push_back(*common);
    covered += shape_numel(common->shape);
    if (on_read) on_read(shape_numel(common->shape) * static_cast<int64_t>(itemsize(saved.dtype)));
  }
  DTR_CHECK(covered == shape_numel(wanted.shape), ValueError,
            "{}: '{}', tensor '{}': the saved chunks cover {} of the {} elements to read at offset {} of shape {} "
            "(corrupt metadata)",
            kLoad, dir_, name, covered, shape_numel(wanted.shape), wanted.offset, wanted.shape);
}

}  // namespace dtr::checkpoint::internal
