// POSIX file helpers (checkpoints, full state dict files): whole writes, positioned reads, and the fsyncs that
// make a file and a directory entry durable (a rename is durable only once the directory
// holding it is fsync'ed). Every failing system call throws OSError naming the call and the
// path; `op` (for instance "checkpoint::save") opens each message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/file_descriptor.h"

namespace dtr {

// open(path, flags, 0644); OSError on failure.
FileDescriptor open_file(const std::string& path, int flags, std::string_view op);
// Writes all `size` bytes (retrying short writes and EINTR).
void write_all(int fd, const void* data, size_t size, const std::string& path, std::string_view op);
// Reads up to `size` bytes at `offset` (retrying short reads and EINTR); returns how many
// were read, fewer only at the end of the file.
size_t read_at(int fd, void* data, size_t size, int64_t offset, const std::string& path, std::string_view op);
// The size of an open file (fstat).
int64_t file_size(int fd, const std::string& path, std::string_view op);
// fsync(fd) and then close it, either failing with OSError.
void sync_and_close(FileDescriptor fd, const std::string& path, std::string_view op);
// Creates `path` (which must not exist) holding `bytes`, fsync'ed.
void write_file_durably(const std::string& path, std::string_view bytes, std::string_view op);
// Writes `text` to path + ".tmp", fsyncs it and renames it over `path`: a reader sees the old
// file or the new one, never half of one. OSError naming `op`, the failed call and the path;
// on failure the temporary file is removed and `path` is left as it was.
void write_file_atomically(const std::string& path, std::string_view text, std::string_view op);
// fsyncs a directory, so that the entries created, renamed or removed in it are durable.
void sync_directory(const std::string& path, std::string_view op);

}  // namespace dtr
