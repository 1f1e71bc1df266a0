#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "checkpoint/safetensors_header.h"
#include "core/error.h"
#include "core/file_descriptor.h"
#include "core/temp_path.h"

namespace dtr::safetensors {

void save_file(const TensorMap& tensors, const std::string& path, const SafetensorsMetadata& metadata) {
  // Largest element first, then by name: every tensor starts at a multiple of its element size.
  std::vector<const TensorMap::value_type*> order;
  for (const auto& item : tensors) order.push_back(&item);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return itemsize(a->second.dtype()) > itemsize(b->second.dtype());
  });
  std::vector<SafetensorsEntry> entries;
  std::vector<Tensor> data;
  int64_t offset = 0;
  for (const auto* item : order) {
    const Tensor& t = item->second;
    DTR_CHECK(t.device().is_cpu(), ValueError, "save_file '{}': tensor '{}' is on {}; move it to the CPU first", path,
              item->first, t.device());
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    entries.push_back({item->first, t.dtype(), t.shape(), offset, offset + bytes});
    offset += bytes;
    data.push_back(t.contiguous());
  }
  const std::string header = safetensors_header_bytes(entries, metadata);

  const std::string name = path + ".tmp";
  FileDescriptor fd(::open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) throw OSError(errno, fmt::format("save_file: open('{}')", name));
  TempPath temp(name);  // any failure from here on removes it: `path` is the old file or the new one
  auto write_all = [&](const void* p, size_t n) {
    const char* bytes = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd.get(), bytes, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw OSError(errno, fmt::format("save_file: write('{}')", name));
      bytes += w;
      n -= static_cast<size_t>(w);
    }
  };
  write_all(header.data(), header.size());
  for (const Tensor& t : data) write_all(t.data(), t.nbytes());
  if (::fsync(fd.get()) != 0 || ::close(fd.release()) != 0) {
    throw OSError(errno, fmt::format("save_file: fsync('{}')", name));
  }
  temp.rename_to(path, "save_file");
}

TensorMap load_file(const std::string& path, SafetensorsMetadata* metadata) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw OSError(errno, fmt::format("load_file: open('{}')", path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw OSError(errno, fmt::format("load_file: fstat('{}')", path));
  const int64_t file_size = st.st_size;
  // Reads exactly n bytes at `offset`; the sizes were checked against the file's, so a short
  // read means the file changed underneath.
  auto read_at = [&](void* p, int64_t n, int64_t offset) {
    char* bytes = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t r = ::pread(fd.get(), bytes, static_cast<size_t>(n), offset);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw OSError(errno, fmt::format("load_file: read('{}')", path));
      DTR_CHECK(r > 0, ValueError, "load_file '{}': the file ended early (changed while being read?)", path);
      bytes += r;
      n -= r;
      offset += r;
    }
  };
  std::array<uint8_t, 8> prefix{};
  if (file_size >= 8) read_at(prefix.data(), 8, 0);
  const int64_t n = safetensors_header_length(prefix, file_size, path);
  std::string json(static_cast<size_t>(n), '\0');
  read_at(json.data(), n, 8);
  const SafetensorsHeader header = parse_safetensors_header(json, file_size - 8 - n, path);
  TensorMap tensors;
  for (const SafetensorsEntry& e : header.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype, kCPU);
    read_at(t.data(), e.end - e.begin, 8 + n + e.begin);
    if (e.dtype == kBool) {
      const auto* bytes = static_cast<const uint8_t*>(t.data());
      const bool valid = std::all_of(bytes, bytes + t.numel(), [](uint8_t b) { return b <= 1; });
      DTR_CHECK(valid, ValueError, "safetensors file '{}', tensor '{}': a BOOL byte is neither 0 nor 1", path, e.name);
    }
    tensors.emplace(e.name, std::move(t));
  }
  if (metadata) *metadata = header.metadata;
  return tensors;
}

}  // namespace dtr::safetensors
