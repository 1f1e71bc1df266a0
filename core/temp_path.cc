#include "core/temp_path.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <system_error>

#include "core/error.h"

namespace dtr {

TempPath TempPath::make_directory(const std::filesystem::path& parent, std::string_view prefix, std::string_view op) {
  std::string pattern = (parent / fmt::format("{}.XXXXXX", prefix)).string();
  if (::mkdtemp(pattern.data()) == nullptr) throw OSError(errno, fmt::format("{}: mkdtemp('{}')", op, pattern));
  return TempPath(pattern);
}

void TempPath::rename_to(const std::filesystem::path& target, std::string_view op) {
  if (std::rename(path_.c_str(), target.c_str()) != 0) {
    throw OSError(errno, fmt::format("{}: rename('{}', '{}')", op, path_.string(), target.string()));
  }
  release();
}

void TempPath::reset() noexcept {
  if (path_.empty()) return;
  std::error_code ec;  // a path never created, or already gone, is fine
  std::filesystem::remove_all(path_, ec);
  path_.clear();
}

}  // namespace dtr
