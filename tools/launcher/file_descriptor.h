// FileDescriptor: the one owner of a POSIX file descriptor (a pipe end, a socket).
//
// It closes the descriptor when destroyed, is move-only, and -1 means "owns nothing".
// Every descriptor the launcher opens is held by one, so no error path leaks one into
// a rank (they are also opened O_CLOEXEC). The idea is std::unique_ptr's, for an int.
#pragma once

#include <unistd.h>

#include <utility>

namespace dtr::launcher {

class FileDescriptor {
 public:
  FileDescriptor() = default;
  // Takes ownership of `fd` (-1 for none).
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the descriptor, if any.
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace dtr::launcher
