#include "core/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.h"
#include "core/temp_path.h"

namespace dtr {

FileDescriptor open_file(const std::string& path, int flags, std::string_view op) {
  FileDescriptor fd(::open(path.c_str(), flags | O_CLOEXEC, 0644));
  if (!fd.valid()) throw OSError(errno, fmt::format("{}: open('{}')", op, path));
  return fd;
}

void write_all(int fd, const void* data, size_t size, const std::string& path, std::string_view op) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw OSError(errno, fmt::format("{}: write('{}')", op, path));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

size_t read_at(int fd, void* data, size_t size, int64_t offset, const std::string& path, std::string_view op) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw OSError(errno, fmt::format("{}: pread('{}')", op, path));
    if (n == 0) break;  // end of file
    done += static_cast<size_t>(n);
  }
  return done;
}

int64_t file_size(int fd, const std::string& path, std::string_view op) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw OSError(errno, fmt::format("{}: fstat('{}')", op, path));
  return static_cast<int64_t>(st.st_size);
}

void sync_and_close(FileDescriptor fd, const std::string& path, std::string_view op) {
  if (::fsync(fd.get()) != 0) throw OSError(errno, fmt::format("{}: fsync('{}')", op, path));
  if (::close(fd.release()) != 0) throw OSError(errno, fmt::format("{}: close('{}')", op, path));
}

void write_file_durably(const std::string& path, std::string_view bytes, std::string_view op) {
  FileDescriptor fd = open_file(path, O_WRONLY | O_CREAT | O_EXCL, op);
  write_all(fd.get(), bytes.data(), bytes.size(), path, op);
  sync_and_close(std::move(fd), path, op);
}

void sync_directory(const std::string& path, std::string_view op) {
  FileDescriptor fd = open_file(path, O_RDONLY | O_DIRECTORY, op);
  if (::fsync(fd.get()) != 0) throw OSError(errno, fmt::format("{}: fsync('{}')", op, path));
}

void write_file_atomically(const std::string& path, std::string_view text, std::string_view op) {
  const std::string name = path + ".tmp";
  FileDescriptor fd = open_file(name, O_WRONLY | O_CREAT | O_TRUNC, op);
  TempPath temp(name);  // any failure from here on removes it, so that only `path` is ever left
  write_all(fd.get(), text.data(), text.size(), name, op);
  sync_and_close(std::move(fd), name, op);
  temp.rename_to(path, op);
}

}  // namespace dtr
