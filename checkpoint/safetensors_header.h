// The .safetensors header: parsing and checking it, and writing one. No tensors and no
// files here, so the parser builds alone for fuzzing: checkpoint/safetensors.h (whole files),
// checkpoint/full_state_dict_file.h (full state dicts) and dtensor's checkpoint chunk files use it.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON, then the data. The
// JSON maps each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]} (bytes
// of the data section) and may hold "__metadata__", a map of strings. Tensors tile the data
// section exactly. dtr reads and writes F32, F64, BF16, F16, I32, I64 and BOOL. Every defect
// (a short or oversized header, bad JSON, a duplicate name, an unknown dtype, a shape that
// does not match its bytes, overlapping, missing or out-of-range offsets) is a ValueError
// or TypeError naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace dtr {

using SafetensorsMetadata = std::map<std::string, std::string>;

// The largest header read (the reference implementation's limit).
inline constexpr int64_t kMaxSafetensorsHeader = 100'000'000;

// One tensor of a header: its bytes are [begin, end) of the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t begin;
  int64_t end;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in offset order
  SafetensorsMetadata metadata;
};

// The element count of `shape`, or nullopt when it overflows int64; the bytes of a tensor of
// `shape` and `dtype`, or nullopt when they do. Readers of untrusted headers and metadata
// check a shape with these before any other arithmetic on it.
std::optional<int64_t> checked_numel(std::span<const int64_t> shape);
std::optional<int64_t> checked_nbytes(std::span<const int64_t> shape, DType dtype);

// `text` with every byte outside printable ASCII written as \xNN: a JSON parser's message
// echoes the bytes it read last, which in a corrupt file may be anything.
std::string escape_bytes(std::string_view text);

// The header length N from a file's first 8 bytes, checked against the file's size.
int64_t safetensors_header_length(std::span<const uint8_t> prefix, int64_t file_size, std::string_view file);

// The JSON header parsed and checked against a data section of `data_size` bytes.
SafetensorsHeader parse_safetensors_header(std::string_view json, int64_t data_size, std::string_view file);

// The 8-byte length and the JSON of a header for `entries` (which must tile the data
// section from 0), padded with spaces so that the data section starts 8-byte aligned.
std::string safetensors_header_bytes(const std::vector<SafetensorsEntry>& entries, const SafetensorsMetadata& metadata);

}  // namespace dtr
