#include "checkpoint/full_state_dict_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include "checkpoint/internal/rank_failure.h"
#include "checkpoint/safetensors_header.h"
#include "collectives/init.h"
#include "collectives/process_group.h"
#include "core/error.h"
#include "core/file_descriptor.h"
#include "core/posix_file.h"
#include "core/temp_path.h"

namespace dtr::checkpoint {
namespace {

constexpr std::string_view kSingleFileName = "model.safetensors";

int world_rank() { return is_initialized() ? default_group()->rank() : 0; }

// The group whose ranks learn each other's outcome: the default one, or none in a world of one.
ProcessGroup* outcome_group() {
  return is_initialized() && default_group()->size() > 1 ? default_group().get() : nullptr;
}

// Every rank calls it, with its own failure or null; when any rank failed, every rank throws
// (the failed one its own error, the others the same type naming it: rank_failure.h).
void raise_if_any_rank_failed(std::exception_ptr failure, std::string_view op, const std::string& path) {
  internal::raise_if_any_rank_failed(outcome_group(), failure, fmt::format("{} '{}'", op, path));
}

int64_t entry_bytes(const DTensor& value) {
  return shape_numel(value.shape()) * static_cast<int64_t>(itemsize(value.dtype()));
}

std::string describe(DType dtype, const Shape& shape) { return fmt::format("{}[{}]", dtype, fmt::join(shape, ", ")); }

// ---- Writing (rank 0) ---------------------------------------------------------------------

// sync_and_close `fd` and rename `temp` over `path`: the file appears whole or not at all.
void commit(FileDescriptor fd, TempPath& temp, const std::string& path, std::string_view op) {
  sync_and_close(std::move(fd), temp.string(), op);
  temp.rename_to(path, op);
}

// `path`'s temporary name while it is written: unique per process, so two saves of one
// file from different processes do not write into each other.
std::string temporary_name(const std::string& path) { return fmt::format("{}.tmp-{}", path, ::getpid()); }

// Opens (creating or truncating) `path`'s temporary file for writing, and takes it over:
// `temp` removes it unless it is committed.
FileDescriptor open_temporary(const std::string& path, TempPath& temp, std::string_view op) {
  const std::string name = temporary_name(path);
  FileDescriptor fd(::open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) throw OSError(errno, fmt::format("{}: open('{}')", op, name));
  temp = TempPath(name);
  return fd;
}

std::string parent_directory(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// One file to write: its path and the state entries (indices into the state dict) it holds.
struct FilePlan {
  std::string path;
  std::vector<size_t> entries;
};

// Writes each plan's file: its header first, then its tensors as they are gathered, one at a
// time (every rank takes part in each gather; ranks other than 0 drop the result at once).
// A failure on rank 0 lands in `failure` and stops its writing (its temporary file goes), but
// not its part in the gathers, so that every rank reaches the exchange of outcomes
// (raise_if_any_rank_failed) instead of hanging.
void write_files(const nn::StateDict& state, const std::vector<FilePlan>& plans, std::string_view op,
                 std::exception_ptr& failure) {
  const bool writer = world_rank() == 0;
  for (const FilePlan& plan : plans) {
    // Largest element size first, as save_file does: every tensor starts aligned.
    std::vector<size_t> order = plan.entries;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return itemsize(state[a].second.dtype()) > itemsize(state[b].second.dtype());
    });
    std::vector<SafetensorsEntry> entries;
    int64_t offset = 0;
    for (size_t i : order) {
      const DTensor& value = state[i].second;
      entries.push_back({state[i].first, value.dtype(), value.shape(), offset, offset + entry_bytes(value)});
      offset = entries.back().end;
    }
    TempPath temp;  // removed at the end of this iteration unless committed
    FileDescriptor fd;
    auto attempt = [&](auto&& step) {
      if (!writer || failure) return;
      try {
        step();
      } catch (...) {
        failure = std::current_exception();
      }
    };
    attempt([&] {
      // {"format": "pt"}: what transformers' from_pretrained looks for.
      const std::string header = safetensors_header_bytes(entries, {{"format", "pt"}});
      fd = open_temporary(plan.path, temp, op);
      write_all(fd.get(), header.data(), header.size(), temp.string(), op);
    });
    for (size_t k = 0; k < order.size(); ++k) {
      Tensor full = state[order[k]].second.full_tensor();  // collective: every rank, every entry
      attempt([&] {
        full = full.to(kCPU).contiguous();
        DTR_INTERNAL_ASSERT(static_cast<int64_t>(full.nbytes()) == entries[k].end - entries[k].begin,
                            "'{}' gathered {} bytes, its header entry holds {}", entries[k].name, full.nbytes(),
                            entries[k].end - entries[k].begin);
        write_all(fd.get(), full.data(), full.nbytes(), temp.string(), op);
      });
    }
    attempt([&] { commit(std::move(fd), temp, plan.path, op); });
  }
}

// ---- Reading (every rank, its own chunks) -------------------------------------------------

// A .safetensors file opened and its header parsed and checked (checkpoint/safetensors_header.h).
struct OpenFile {
  std::string path;
  FileDescriptor fd;
  int64_t data_start = 0;
  SafetensorsHeader header;
};

// Reads exactly `size` bytes at `offset`; the header was checked against the file's size, so
// a short read means the file changed underneath.
void read_exact(const OpenFile& file, void* data, int64_t size, int64_t offset, std::string_view tensor,
                std::string_view op) {
  const size_t got = read_at(file.fd.get(), data, static_cast<size_t>(size), offset, file.path,
                             fmt::format("{}, tensor '{}'", op, tensor));
  DTR_CHECK(got == static_cast<size_t>(size), ValueError,
            "{}: safetensors file '{}' ended early in tensor '{}' (changed while being read?)", op, file.path, tensor);
}

std::unique_ptr<OpenFile> open_safetensors(const std::string& path, std::string_view op) {
  auto file = std::make_unique<OpenFile>();
  file->path = path;
  file->fd = FileDescriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!file->fd.valid()) throw OSError(errno, fmt::format("{}: open('{}')", op, path));
  struct stat st {};
  if (::fstat(file->fd.get(), &st) != 0) throw OSError(errno, fmt::format("{}: fstat('{}')", op, path));
  const int64_t size = st.st_size;
  std::array<uint8_t, 8> prefix{};
  if (size >= 8) read_exact(*file, prefix.data(), 8, 0, "(header)", op);
  const int64_t n = safetensors_header_length(prefix, size, path);
  std::string json(static_cast<size_t>(n), '\0');
  read_exact(*file, json.data(), n, 8, "(header)", op);
  file->header = parse_safetensors_header(json, size - 8 - n, path);
  file->data_start = 8 + n;
  return file;
}

// The chunk `chunk` of tensor `e`, read with one pread per contiguous run: the innermost dims
// the chunk covers whole join the run of the outermost dim it cuts (a Shard(0) chunk is one
// run; a Shard(1) chunk of a matrix one run per row).
Tensor read_chunk(const OpenFile& file, const SafetensorsEntry& e, const LocalChunk& chunk, std::string_view op) {
  Tensor out = Tensor::empty(chunk.shape, e.dtype, kCPU);
  if (out.numel() == 0) return out;
  const auto item = static_cast<int64_t>(itemsize(e.dtype));
  const auto ndim = static_cast<int64_t>(e.shape.size());
  char* dst = static_cast<char*>(out.data());
  if (ndim == 0) {
    read_exact(file, dst, item, file.data_start + e.begin, e.name, op);
    return out;
  }
  std::vector<int64_t> stride(ndim, 1);  // in elements, row-major
  for (int64_t d = ndim - 2; d >= 0; --d) stride[d] = stride[d + 1] * e.shape[d + 1];
  int64_t k = ndim - 1;
  while (k > 0 && chunk.shape[k] == e.shape[k]) --k;
  const int64_t run = chunk.shape[k] * stride[k] * item;
  std::vector<int64_t> index(k, 0);  // over dims [0, k) of the chunk
  for (;;) {
    int64_t element = chunk.offset[k] * stride[k];
    for (int64_t d = 0; d < k; ++d) element += (chunk.offset[d] + index[d]) * stride[d];
    read_exact(file, dst, run, file.data_start + e.begin + element * item, e.name, op);
    dst += run;
    int64_t d = k - 1;
    for (; d >= 0; --d) {
      if (++index[d] < chunk.shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) break;
  }
  if (e.dtype == kBool) {
    const auto* bytes = static_cast<const uint8_t*>(out.data());
    const bool valid = std::all_of(bytes, bytes + out.numel(), [](uint8_t b) { return b <= 1; });
    DTR_CHECK(valid, ValueError, "{}: safetensors file '{}', tensor '{}': a BOOL byte is neither 0 nor 1", op,
              file.path, e.name);
  }
  return out;
}

// Where each name's bytes are.
struct Source {
  const OpenFile* file;
  const SafetensorsEntry* entry;
};

// What a load reads before it changes anything: this rank's chunk of every entry found, under
// the entry's own spec, and the names that did not match.
struct ReadChunks {
  nn::StateDict chunks;
  nn::LoadResult result;
};

// Checks names, shapes and dtypes (every problem before anything is read), then reads each
// rank's chunks, for load_state_dict.
ReadChunks read_sources(nn::Module& module, const std::map<std::string, Source>& sources, const std::string& where,
                        nn::Strict strict, std::string_view op) {
  const nn::StateDict current = module.state_dict();
  // A tied entry (one tensor under several names, as gpt's output.weight is embed.weight) is
  // loaded through any of its names the file holds: PyTorch's save_model and Hugging Face's
  // save_pretrained keep one.
  const auto tie_in_file = [&](const std::string& name, const DTensor& value) -> const std::string* {
    for (const auto& [other, v] : current) {
      if (other != name && v.is_same(value) && sources.contains(other)) return &other;
    }
    return nullptr;
  };
  ReadChunks read;
  nn::LoadResult& result = read.result;
  std::set<std::string> known;
  for (const auto& [name, value] : current) {
    known.insert(name);
    if (!sources.contains(name) && tie_in_file(name, value) == nullptr) result.missing_keys.push_back(name);
  }
  for (const auto& [name, source] : sources) {
    if (!known.contains(name)) result.unexpected_keys.push_back(name);
  }
  DTR_CHECK(strict == nn::Strict::kNo || (result.missing_keys.empty() && result.unexpected_keys.empty()), ValueError,
            "{}: '{}' does not match the module: missing keys (the module's, not in the file): {}; unexpected "
            "keys (in the file, not the module's): {}; Strict::kNo loads the names that match",
            op, where, list_summary(result.missing_keys), list_summary(result.unexpected_keys));
  for (const auto& [name, value] : current) {
    const auto it = sources.find(name);
    if (it == sources.end()) continue;
    const SafetensorsEntry& e = *it->second.entry;
    DTR_CHECK(e.shape == value.shape(), ValueError,
              "{}: tensor '{}' of safetensors file '{}' is {}, the module's entry is {}: a different model?", op, name,
              it->second.file->path, describe(e.dtype, e.shape), describe(value.dtype(), value.shape()));
    DTR_CHECK(e.dtype == value.dtype(), TypeError,
              "{}: tensor '{}' of safetensors file '{}' is {}, the module's entry is {}; convert the module (to()) "
              "or the file",
              op, name, it->second.file->path, describe(e.dtype, e.shape), describe(value.dtype(), value.shape()));
  }
  // A file holding a tied tensor under two names loads when the two are equal; every rank
  // reads and compares them whole, so every rank decides alike.
  for (const auto& [name, value] : current) {
    const std::string* other = sources.contains(name) ? tie_in_file(name, value) : nullptr;
    if (other == nullptr || *other < name) continue;  // each pair once
    const LocalChunk whole{Shape(value.shape().size(), 0), value.shape()};
    const Source& a = sources.at(name);
    const Source& b = sources.at(*other);
    const Tensor x = read_chunk(*a.file, *a.entry, whole, op), y = read_chunk(*b.file, *b.entry, whole, op);
    DTR_CHECK(std::memcmp(x.data(), y.data(), x.nbytes()) == 0, ValueError,
              "{}: '{}' holds '{}' and '{}', which the module ties (one tensor), with different values; keep one "
              "name, or make them equal",
              op, where, name, *other);
  }
  nn::StateDict& chunks = read.chunks;
  for (const auto& [name, value] : current) {
    const auto it = sources.find(name);
    if (it == sources.end()) continue;
    // A Partial entry takes the whole value as Replicate; load_state_dict redistributes it.
    const DTensorSpec spec(value.spec().mesh(), reduced_placements(value.placements()), value.shape(), value.dtype());
    // One read per piece (several for a StridedShard), placed where the piece sits locally.
    const std::vector<LocalPiece> pieces = spec.local_pieces();
    Tensor local = pieces.size() == 1 ? read_chunk(*it->second.file, *it->second.entry, pieces[0].chunk, op)
                                      : Tensor::empty(spec.local_shape(), it->second.entry->dtype, kCPU);
    if (pieces.size() > 1) {
      for (const LocalPiece& piece : pieces) {
        chunk_of(local, {piece.local_offset, piece.chunk.shape})
            .copy_(read_chunk(*it->second.file, *it->second.entry, piece.chunk, op));
      }
    }
    chunks.emplace_back(name, DTensor(local.to(spec.mesh().device()), spec));
  }
  return read;
}

std::map<std::string, Source> sources_of(const OpenFile& file) {
  std::map<std::string, Source> sources;
  for (const SafetensorsEntry& e : file.header.entries) sources.emplace(e.name, Source{&file, &e});
  return sources;
}

constexpr std::string_view kLoadFile = "load_full_state_dict_file";

ReadChunks read_file(nn::Module& module, const std::string& path, nn::Strict strict) {
  const std::unique_ptr<OpenFile> file = open_safetensors(path, kLoadFile);
  return read_sources(module, sources_of(*file), path, strict, kLoadFile);
}

// load_hf_checkpoint's reading: through the index, or the directory's one model.safetensors.
ReadChunks read_hf(nn::Module& module, const std::string& dir, nn::Strict strict, std::string_view op) {
  const std::string index_path = dir + "/" + std::string(kHfIndexName);
  if (!std::filesystem::exists(index_path)) {
    const std::string single = dir + "/" + std::string(kSingleFileName);
    if (std::filesystem::exists(single)) return read_file(module, single, strict);
    throw OSError(ENOENT, fmt::format("{}: '{}' holds neither {} nor {}", op, dir, kHfIndexName, kSingleFileName));
  }
  std::ifstream in(index_path);
  if (!in) throw OSError(errno, fmt::format("{}: open('{}')", op, index_path));
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  DTR_CHECK(
      !index.is_discarded() && index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
      ValueError, "{}: index '{}' is not JSON with a \"weight_map\" object", op, index_path);
  std::map<std::string, std::unique_ptr<OpenFile>> files;
  std::map<std::string, Source> sources;
  for (const auto& [name, file_name] : index["weight_map"].items()) {
    DTR_CHECK(file_name.is_string(), ValueError, "{}: index '{}' maps '{}' to {}, not a file name", op, index_path,
              name, file_name.dump());
    const std::string base = file_name.get<std::string>();
    DTR_CHECK(!base.empty() && base.find('/') == std::string::npos && base != "..", ValueError,
              "{}: index '{}' maps '{}' to '{}', not a file name in the directory", op, index_path, name, base);
    auto& file = files[base];
    if (!file) file = open_safetensors(dir + "/" + base, op);
    const auto it = std::find_if(file->header.entries.begin(), file->header.entries.end(),
                                 [&](const SafetensorsEntry& e) { return e.name == name; });
    DTR_CHECK(it != file->header.entries.end(), ValueError,
              "{}: index '{}' maps tensor '{}' to '{}', which does not hold it", op, index_path, name, file->path);
    sources.emplace(name, Source{file.get(), &*it});
  }
  return read_sources(module, sources, dir, strict, op);
}

// Reads this rank's chunks (`read`), learns whether every rank did, and only then loads them:
// when any rank fails, every rank throws and no rank's module changes.
nn::LoadResult load_agreed(nn::Module& module, const std::function<ReadChunks()>& read, std::string_view op,
                           const std::string& path) {
  ReadChunks mine;
  std::exception_ptr failure;
  try {
    mine = read();
  } catch (...) {
    failure = std::current_exception();
  }
  raise_if_any_rank_failed(failure, op, path);
  module.load_state_dict(mine.chunks, nn::Strict::kNo);
  return mine.result;
}

}  // namespace

void save_full_state_dict(nn::Module& module, const std::string& path) {
  constexpr std::string_view op = "save_full_state_dict";
  const nn::StateDict state = module.state_dict();
  FilePlan plan{path, {}};
  for (size_t i = 0; i < state.size(); ++i) plan.entries.push_back(i);
  std::exception_ptr failure;
  write_files(state, {plan}, op, failure);
  if (world_rank() == 0 && !failure) {
    try {
      sync_directory(parent_directory(path), op);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  raise_if_any_rank_failed(failure, op, path);
}

nn::LoadResult load_full_state_dict_file(nn::Module& module, const std::string& path, nn::Strict strict) {
  return load_agreed(
      module, [&] { return read_file(module, path, strict); }, kLoadFile, path);
}

HfLayout plan_hf_layout(const std::vector<int64_t>& bytes, int64_t max_shard_bytes) {
  DTR_CHECK(max_shard_bytes > 0, ValueError, "Hugging Face layout: max_shard_bytes must be positive, got {}",
            max_shard_bytes);
  HfLayout layout;
  layout.files.emplace_back();
  int64_t filled = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!layout.files.back().empty() && filled + bytes[i] > max_shard_bytes) {
      layout.files.emplace_back();
      filled = 0;
    }
    layout.files.back().push_back(i);
    filled += bytes[i];
    layout.total_bytes += bytes[i];
  }
  for (size_t f = 0; f < layout.files.size(); ++f) {
    layout.file_names.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, layout.files.size()));
  }
  return layout;
}

std::string HfLayout::index_json(const std::vector<std::string>& entry_names) const {
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t f = 0; f < files.size(); ++f) {
    for (size_t i : files[f]) weight_map[entry_names.at(i)] = file_names[f];
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_bytes}};
  index["weight_map"] = weight_map;
  return index.dump(2) + "\n";
}

void save_hf_checkpoint(nn::Module& module, const std::string& dir, int64_t max_shard_bytes) {
  constexpr std::string_view op = "save_hf_checkpoint";
  DTR_CHECK(max_shard_bytes > 0, ValueError, "{} '{}': max_shard_bytes must be positive, got {}", op, dir,
            max_shard_bytes);
  const nn::StateDict state = module.state_dict();
  std::vector<int64_t> bytes;
  std::vector<std::string> names;
  for (const auto& [name, value] : state) {
    bytes.push_back(entry_bytes(value));
    names.push_back(name);
  }
  const HfLayout layout = plan_hf_layout(bytes, max_shard_bytes);
  std::vector<FilePlan> plans;
  for (size_t f = 0; f < layout.files.size(); ++f) plans.push_back({dir + "/" + layout.file_names[f], layout.files[f]});
  std::exception_ptr failure;
  if (world_rank() == 0) {
    try {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec) throw OSError(ec.value(), fmt::format("{}: mkdir('{}')", op, dir));
      // An index left by an earlier save would name a mix of old and new files if this one
      // stopped midway: it goes first, so an interrupted save is detectably incomplete.
      const std::string old_index = dir + "/" + std::string(kHfIndexName);
      if (::unlink(old_index.c_str()) != 0 && errno != ENOENT) {
        throw OSError(errno, fmt::format("{}: unlink('{}')", op, old_index));
      }
      sync_directory(dir, op);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  write_files(state, plans, op, failure);
  if (world_rank() == 0 && !failure) {
    // The index last: a reader that finds it finds every file it names.
    try {
      const std::string text = layout.index_json(names);
      const std::string path = dir + "/" + std::string(kHfIndexName);
      TempPath temp;
      FileDescriptor fd = open_temporary(path, temp, op);
      write_all(fd.get(), text.data(), text.size(), temp.string(), op);
      commit(std::move(fd), temp, path, op);
      sync_directory(dir, op);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  raise_if_any_rank_failed(failure, op, dir);
}

nn::LoadResult load_hf_checkpoint(nn::Module& module, const std::string& dir, nn::Strict strict) {
  constexpr std::string_view op = "load_hf_checkpoint";
  return load_agreed(
      module, [&] { return read_hf(module, dir, strict, op); }, op, dir);
}

}  // namespace dtr::checkpoint
