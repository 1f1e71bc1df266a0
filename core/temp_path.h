// TempPath: the one owner of a temporary file or directory (a file written under a temporary
// name and renamed into place, a scratch directory).
//
// It removes the path, with whatever a directory holds, when destroyed, unless rename_to or
// release handed it on first; so no error path leaves a temporary behind. Move-only; an
// empty path owns nothing. The idea is std::unique_ptr's (and FileDescriptor's), for a path.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

namespace dtr {

class TempPath {
 public:
  TempPath() = default;
  // Takes ownership of `path`, which need not exist yet.
  explicit TempPath(std::filesystem::path path) : path_(std::move(path)) {}
  TempPath(TempPath&& other) noexcept : path_(other.release()) {}
  TempPath& operator=(TempPath&& other) noexcept {
    if (this != &other) {
      reset();
      path_ = other.release();
    }
    return *this;
  }
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  ~TempPath() { reset(); }

  // A new empty directory `parent`/`prefix`.XXXXXX (mkdtemp), owned; OSError naming `op`.
  static TempPath make_directory(const std::filesystem::path& parent, std::string_view prefix, std::string_view op);

  const std::filesystem::path& path() const { return path_; }
  std::string string() const { return path_.string(); }
  // rename(2)s the path to `target` (replacing a file, or an empty directory, there) and owns
  // nothing afterwards; OSError naming `op`, the call and both paths, still owning, on failure.
  void rename_to(const std::filesystem::path& target, std::string_view op);
  // Gives up ownership without removing anything (the path moved into place, or is kept on
  // purpose); returns it and owns nothing.
  std::filesystem::path release() { return std::exchange(path_, std::filesystem::path()); }
  // Removes the path now, if any (errors ignored: it may never have been created).
  void reset() noexcept;

 private:
  std::filesystem::path path_;
};

}  // namespace dtr
