#include "checkpoint/safetensors_header.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include "checkpoint/safetensors_dtype.h"
#include "core/error.h"

namespace dtr {
namespace {

using Json = nlohmann::json;

// A non-negative integer that fits int64, or nullopt.
std::optional<int64_t> non_negative(const Json& v) {
  if (!v.is_number_unsigned()) return std::nullopt;
  const uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(u);
}

// One tensor's entry, checked on its own (the tiling is checked over all of them).
SafetensorsEntry parse_entry(const std::string& name, const Json& v, std::string_view file) {
  const auto where = [&] { return fmt::format("safetensors file '{}', tensor '{}'", file, name); };
  DTR_CHECK(v.is_object(), ValueError, "{}: the entry is not an object: {}", where(), v.dump());
  for (const auto& [key, value] : v.items()) {
    DTR_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", ValueError,
              "{}: unknown field '{}'; an entry holds dtype, shape and data_offsets", where(), key);
  }
  DTR_CHECK(v.contains("dtype") && v["dtype"].is_string(), ValueError, "{}: no dtype string", where());
  const std::string dtype = v["dtype"].get<std::string>();
  const std::optional<DType> known = dtype_from_safetensors(dtype);
  DTR_CHECK(known.has_value(), TypeError,
            "{}: dtype '{}' is not one dtr reads; it reads F32, F64, BF16, F16, I32, I64 and BOOL", where(), dtype);
  SafetensorsEntry entry{name, *known, {}, 0, 0};
  DTR_CHECK(v.contains("shape") && v["shape"].is_array(), ValueError, "{}: no shape array", where());
  for (const Json& size : v["shape"]) {
    const std::optional<int64_t> s = non_negative(size);
    DTR_CHECK(s.has_value(), ValueError, "{}: shape {} holds '{}', not a size", where(), v["shape"].dump(),
              size.dump());
    entry.shape.push_back(*s);
  }
  const std::optional<int64_t> bytes = checked_nbytes(entry.shape, entry.dtype);
  DTR_CHECK(bytes.has_value(), ValueError,
            "{}: shape {} has too many elements: its size in bytes as {} overflows int64", where(), v["shape"].dump(),
            dtype);
  DTR_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2, ValueError,
            "{}: data_offsets must be [begin, end]", where());
  const std::optional<int64_t> begin = non_negative(v["data_offsets"][0]), end = non_negative(v["data_offsets"][1]);
  DTR_CHECK(begin && end && *begin <= *end, ValueError, "{}: data_offsets {} are not [begin, end] with begin <= end",
            where(), v["data_offsets"].dump());
  entry.begin = *begin;
  entry.end = *end;
  DTR_CHECK(*bytes == entry.end - entry.begin, ValueError,
            "{}: a {} tensor of shape {} needs {} bytes but data_offsets {} hold {}", where(), dtype, entry.shape,
            *bytes, v["data_offsets"].dump(), entry.end - entry.begin);
  return entry;
}

// A SAX pass over a JSON text that finds the first key given twice in its top-level object.
// (nlohmann's parser keeps the last of duplicate keys; its callback form, which sees them,
// rescans the parent object at every nested object's end: quadratic in a header's tensors.)
class TopLevelKeys : public Json::json_sax_t {
 public:
  std::string duplicate;  // empty when none

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(Json::number_integer_t) override { return true; }
  bool number_unsigned(Json::number_unsigned_t) override { return true; }
  bool number_float(Json::number_float_t, const Json::string_t&) override { return true; }
  bool string(Json::string_t&) override { return true; }
  bool binary(Json::binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth_ > 0; }
  bool key(Json::string_t& name) override {
    if (depth_ == 1 && !names_.insert(name).second && duplicate.empty()) duplicate = name;
    return true;
  }
  bool end_object() override { return --depth_ >= 0; }
  bool start_array(std::size_t) override { return ++depth_ > 0; }
  bool end_array() override { return --depth_ >= 0; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  int depth_ = 0;
  std::set<std::string> names_;
};

}  // namespace

std::optional<int64_t> checked_numel(std::span<const int64_t> shape) {
  int64_t numel = 1;
  for (const int64_t size : shape) {
    if (__builtin_mul_overflow(numel, size, &numel)) return std::nullopt;
  }
  return numel;
}

std::optional<int64_t> checked_nbytes(std::span<const int64_t> shape, DType dtype) {
  const std::optional<int64_t> numel = checked_numel(shape);
  int64_t bytes = 0;
  if (!numel || __builtin_mul_overflow(*numel, static_cast<int64_t>(itemsize(dtype)), &bytes)) return std::nullopt;
  return bytes;
}

std::string escape_bytes(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  return out;
}

int64_t safetensors_header_length(std::span<const uint8_t> prefix, int64_t file_size, std::string_view file) {
  DTR_CHECK(prefix.size() >= 8 && file_size >= 8, ValueError,
            "safetensors file '{}': {} bytes, too short for the 8-byte header length", file, file_size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | prefix[i];
  DTR_CHECK(n <= static_cast<uint64_t>(kMaxSafetensorsHeader), ValueError,
            "safetensors file '{}': a header of {} bytes is over the {}-byte limit", file, n, kMaxSafetensorsHeader);
  DTR_CHECK(static_cast<int64_t>(n) <= file_size - 8, ValueError,
            "safetensors file '{}': truncated: the header says {} bytes but only {} follow the length", file, n,
            file_size - 8);
  return static_cast<int64_t>(n);
}

SafetensorsHeader parse_safetensors_header(std::string_view json, int64_t data_size, std::string_view file) {
  DTR_CHECK(!json.empty() && json.front() == '{', ValueError,
            "safetensors file '{}': the header does not start with '{{' (not a safetensors file?)", file);
  Json header;
  try {
    header = Json::parse(json.begin(), json.end());
  } catch (const Json::exception& e) {
    throw ValueError(
        fmt::format("safetensors file '{}': the header is not valid JSON: {}", file, escape_bytes(e.what())));
  }
  // Duplicate names would hide a tensor (the parser keeps the last).
  TopLevelKeys keys;
  Json::sax_parse(json.begin(), json.end(), &keys);
  DTR_CHECK(keys.duplicate.empty(), ValueError, "safetensors file '{}': tensor '{}' appears twice in the header", file,
            keys.duplicate);
  DTR_CHECK(header.is_object(), ValueError, "safetensors file '{}': the header is not a JSON object", file);
  SafetensorsHeader out;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      DTR_CHECK(value.is_object(), ValueError, "safetensors file '{}': __metadata__ is not an object", file);
      for (const auto& [key, text] : value.items()) {
        DTR_CHECK(text.is_string(), ValueError, "safetensors file '{}': __metadata__ '{}' is not a string: {}", file,
                  key, text.dump());
        out.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    out.entries.push_back(parse_entry(name, value, file));
  }
  // The tensors tile the data section: in offset order, each begins where the last ended.
  std::sort(out.entries.begin(), out.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  int64_t next = 0;
  for (const SafetensorsEntry& e : out.entries) {
    DTR_CHECK(e.begin == next, ValueError,
              "safetensors file '{}', tensor '{}': data_offsets [{}, {}] {} the previous tensor's end at byte {}", file,
              e.name, e.begin, e.end, e.begin < next ? "overlap" : "leave a gap after", next);
    next = e.end;
  }
  DTR_CHECK(next == data_size, ValueError,
            "safetensors file '{}': the tensors hold {} bytes but the data section has {}{}", file, next, data_size,
            next > data_size ? " (truncated file?)" : "");
  return out;
}

std::string safetensors_header_bytes(const std::vector<SafetensorsEntry>& entries,
                                     const SafetensorsMetadata& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const SafetensorsEntry& e : entries) {
    header[e.name] = {
        {"dtype", std::string(safetensors_dtype(e.dtype))}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(json.size() >> (8 * i));
  return bytes + json;
}

}  // namespace dtr
