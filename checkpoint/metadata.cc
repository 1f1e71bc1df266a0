#include "checkpoint/metadata.h"

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <optional>

#include "checkpoint/safetensors_dtype.h"
#include "checkpoint/safetensors_header.h"
#include "core/error.h"
#include "core/posix_file.h"

namespace dtr::checkpoint::internal {
namespace {

using Json = nlohmann::json;

Json chunk_to_json(const SavedChunk& c) {
  return {{"offset", c.offset},
          {"shape", c.shape},
          {"file", c.file},
          {"byte_range", {c.begin, c.end}},
          {"rows_per_block", c.rows_per_block},
          {"crc32c", c.crc32c}};
}

// A field of an object, or ValueError naming where it is missing.
const Json& field(const Json& object, const char* key, const std::string& where) {
  DTR_CHECK(object.is_object() && object.contains(key), ValueError, "{}: no \"{}\"", where, key);
  return object.at(key);
}

int64_t non_negative(const Json& v, const std::string& where, const char* what) {
  DTR_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, ValueError, "{}: {} must be a non-negative integer, not {}",
            where, what, v.dump());
  return v.get<int64_t>();
}

Shape shape_of(const Json& v, const std::string& where, const char* what) {
  DTR_CHECK(v.is_array(), ValueError, "{}: {} must be an array of sizes, not {}", where, what, v.dump());
  Shape s;
  for (const Json& x : v) s.push_back(non_negative(x, where, what));
  return s;
}

SavedChunk chunk_from_json(const Json& j, const SavedTensor& t, const std::string& where) {
  SavedChunk c;
  c.offset = shape_of(field(j, "offset", where), where, "offset");
  c.shape = shape_of(field(j, "shape", where), where, "shape");
  DTR_CHECK(c.offset.size() == t.shape.size() && c.shape.size() == t.shape.size(), ValueError,
            "{}: offset {} and shape {} must have the tensor's {} dims", where, c.offset, c.shape, t.shape.size());
  for (size_t d = 0; d < t.shape.size(); ++d) {
    // offset + shape <= size, written so that it cannot overflow.
    DTR_CHECK(c.shape[d] > 0 && c.offset[d] <= t.shape[d] && c.shape[d] <= t.shape[d] - c.offset[d], ValueError,
              "{}: the chunk at offset {} of shape {} is empty or outside the tensor's shape {}", where, c.offset,
              c.shape, t.shape);
  }
  const Json& file = field(j, "file", where);
  DTR_CHECK(file.is_string(), ValueError, "{}: file must be a string, not {}", where, file.dump());
  c.file = file.get<std::string>();
  DTR_CHECK(!c.file.empty() && c.file.find('/') == std::string::npos && c.file != "." && c.file != "..", ValueError,
            "{}: file '{}' is not a plain name in the checkpoint directory", where, c.file);
  const Json& range = field(j, "byte_range", where);
  DTR_CHECK(range.is_array() && range.size() == 2, ValueError, "{}: byte_range must be [begin, end], not {}", where,
            range.dump());
  c.begin = non_negative(range[0], where, "byte_range");
  c.end = non_negative(range[1], where, "byte_range");
  const int64_t bytes = shape_numel(c.shape) * static_cast<int64_t>(itemsize(t.dtype));
  DTR_CHECK(c.end - c.begin == bytes, ValueError,
            "{}: byte_range [{}, {}] holds {} bytes but a {} chunk of shape {} needs {}", where, c.begin, c.end,
            c.end - c.begin, t.dtype, c.shape, bytes);
  c.rows_per_block = non_negative(field(j, "rows_per_block", where), where, "rows_per_block");
  DTR_CHECK(c.rows_per_block > 0, ValueError, "{}: rows_per_block must be positive", where);
  const Json& crcs = field(j, "crc32c", where);
  DTR_CHECK(crcs.is_array(), ValueError, "{}: crc32c must be an array, not {}", where, crcs.dump());
  for (const Json& x : crcs) {
    DTR_CHECK(x.is_number_unsigned() && x.get<uint64_t>() <= 0xffffffffu, ValueError,
              "{}: crc32c holds {}, not a 32-bit checksum", where, x.dump());
    c.crc32c.push_back(static_cast<uint32_t>(x.get<uint64_t>()));
  }
  const int64_t blocks = num_blocks(chunk_rows(c.shape), c.rows_per_block);
  DTR_CHECK(static_cast<int64_t>(c.crc32c.size()) == blocks, ValueError,
            "{}: {} checksums for {} checksum blocks ({} rows, {} per block)", where, c.crc32c.size(), blocks,
            chunk_rows(c.shape), c.rows_per_block);
  return c;
}

}  // namespace

int64_t chunk_rows(const Shape& shape) { return shape.empty() ? 1 : shape[0]; }

int64_t chunk_row_bytes(const Shape& shape, DType dtype) {
  const int64_t rows = chunk_rows(shape);
  return rows == 0 ? 0 : shape_numel(shape) / rows * static_cast<int64_t>(itemsize(dtype));
}

int64_t rows_per_block_for(const Shape& shape, DType dtype) {
  const int64_t row_bytes = chunk_row_bytes(shape, dtype);
  return row_bytes == 0 ? 1 : std::max<int64_t>(1, kChecksumBlockBytes / row_bytes);
}

int64_t num_blocks(int64_t rows, int64_t rows_per_block) { return (rows + rows_per_block - 1) / rows_per_block; }

DType dtype_from_name(std::string_view name, std::string_view where) {
  for (DType d : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64, kBool}) {
    if (dtype_name(d) == name) return d;
  }
  if (const std::optional<DType> d = dtype_from_safetensors(name)) return *d;
  throw ValueError(
      fmt::format("{}: unknown dtype '{}'; dtr knows float32, float64, bfloat16, float16, int32, int64 "
                  "and bool",
                  where, name));
}

Json metadata_to_json(const CheckpointMetadata& metadata) {
  Json tensors = Json::object();
  for (const auto& [name, t] : metadata.tensors) {
    Json chunks = Json::array();
    for (const SavedChunk& c : t.chunks) chunks.push_back(chunk_to_json(c));
    tensors[name] = {{"dtype", std::string(dtype_name(t.dtype))},
                     {"shape", t.shape},
                     {"mesh", t.mesh},
                     {"placements", t.placements},
                     {"chunks", std::move(chunks)}};
  }
  return {{"format", std::string(kFormatName)}, {"version", kFormatVersion},
          {"world_size", metadata.world_size},  {"checksum", "crc32c"},
          {"tensors", std::move(tensors)},      {"extra", metadata.extra}};
}

CheckpointMetadata metadata_from_json(const Json& json, std::string_view path) {
  const std::string top = fmt::format("checkpoint metadata '{}'", path);
  DTR_CHECK(json.is_object() && json.value("format", "") == kFormatName, ValueError,
            "{}: not a dtr checkpoint (\"format\" is not \"{}\")", top, kFormatName);
  const Json& version = field(json, "version", top);
  DTR_CHECK(version.is_number_integer() && version.get<int64_t>() == kFormatVersion, ValueError,
            "{}: format version {}; this dtr reads version {} (a newer dtr wrote it?)", top, version.dump(),
            kFormatVersion);
  DTR_CHECK(json.value("checksum", "") == "crc32c", ValueError, "{}: checksum {} is not \"crc32c\"", top,
            json.value("checksum", Json()).dump());
  CheckpointMetadata m;
  m.world_size = non_negative(field(json, "world_size", top), top, "world_size");
  m.extra = json.contains("extra") ? json.at("extra") : Json();
  const Json& tensors = field(json, "tensors", top);
  DTR_CHECK(tensors.is_object(), ValueError, "{}: \"tensors\" is not an object", top);
  int64_t total_bytes = 0;
  for (const auto& [name, j] : tensors.items()) {
    const std::string where = fmt::format("{}, tensor '{}'", top, name);
    SavedTensor t;
    const Json& dtype = field(j, "dtype", where);
    DTR_CHECK(dtype.is_string(), ValueError, "{}: dtype must be a string, not {}", where, dtype.dump());
    t.dtype = dtype_from_name(dtype.get<std::string>(), where);
    t.shape = shape_of(field(j, "shape", where), where, "shape");
    // Checked first: every element count and byte count below (of the tensor, its chunks
    // and their sums) is then at most this one.
    const std::optional<int64_t> bytes = checked_nbytes(t.shape, t.dtype);
    DTR_CHECK(bytes.has_value(), ValueError,
              "{}: shape {} has too many elements: its size in bytes as {} overflows int64", where, t.shape, t.dtype);
    DTR_CHECK(!__builtin_add_overflow(total_bytes, *bytes, &total_bytes), ValueError,
              "{}: the tensors up to this one hold more than 2^63 - 1 bytes in all", where);
    t.mesh = j.contains("mesh") ? j.at("mesh") : Json();
    if (j.contains("placements") && j.at("placements").is_array()) {
      for (const Json& p : j.at("placements")) t.placements.push_back(p.is_string() ? p.get<std::string>() : p.dump());
    }
    const Json& chunks = field(j, "chunks", where);
    DTR_CHECK(chunks.is_array(), ValueError, "{}: chunks must be an array", where);
    int64_t elements = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      t.chunks.push_back(chunk_from_json(chunks[i], t, fmt::format("{}, chunk {}", where, i)));
      DTR_CHECK(!__builtin_add_overflow(elements, shape_numel(t.chunks.back().shape), &elements), ValueError,
                "{}: the chunks hold more than 2^63 - 1 elements but the tensor of shape {} has {}", where, t.shape,
                shape_numel(t.shape));
    }
    // With every chunk inside the tensor, a sum equal to its numel leaves holes only where
    // chunks overlap; ChunkFileReader::read_region checks the overlaps of the chunks it reads.
    DTR_CHECK(elements == shape_numel(t.shape), ValueError,
              "{}: the chunks hold {} elements but the tensor of shape {} has {}", where, elements, t.shape,
              shape_numel(t.shape));
    m.tensors.emplace(name, std::move(t));
  }
  return m;
}

CheckpointMetadata read_metadata_file(const std::string& path, std::string_view op) {
  FileDescriptor fd = open_file(path, O_RDONLY, op);
  std::string text(static_cast<size_t>(file_size(fd.get(), path, op)), '\0');
  DTR_CHECK(read_at(fd.get(), text.data(), text.size(), 0, path, op) == text.size(), ValueError,
            "{}: '{}' ended early (changed while being read?)", op, path);
  try {
    return metadata_from_json(Json::parse(text), path);
  } catch (const Json::exception& e) {
    throw ValueError(fmt::format("{}: '{}' is not valid checkpoint metadata: {}", op, path, escape_bytes(e.what())));
  }
}

}  // namespace dtr::checkpoint::internal
