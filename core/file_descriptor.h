// FileDescriptor: the one owner of a POSIX file descriptor (a socket, a pipe end, a signalfd).
//
// It closes the descriptor when destroyed, is move-only, and -1 means "owns nothing". Every
// descriptor dtr opens (the store's sockets, the launcher's pipes) is held by one, so no error
// path leaks one; they are also opened close-on-exec, so none leaks into a rank's exec either.
// The idea is std::unique_ptr's, for an int.
#pragma once

#include <unistd.h>

#include <utility>

namespace dtr {

class FileDescriptor {
 public:
  FileDescriptor() = default;
  // Takes ownership of `fd` (-1 for none).
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing: returns the descriptor (or -1) and owns nothing.
  int release() { return std::exchange(fd_, -1); }
  // Closes the descriptor, if any.
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace dtr
