// find_program: PATH lookup the way execvp() does it.
#include "tools/launcher/find_program.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace dtr::launcher {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string find_program(const std::string& name) {
  if (name.empty()) throw ValueError("the program to run is an empty string");
  if (name.find('/') != std::string::npos) {
    if (!is_executable_file(name)) {
      throw ValueError(fmt::format("program '{}' is not an executable file", name));
    }
    return name;
  }
  const char* path_env = std::getenv("PATH");
  // glibc's execvp() searches this when PATH is unset.
  const std::string_view path = path_env != nullptr ? path_env : "/bin:/usr/bin";
  for (size_t begin = 0; begin <= path.size();) {
    size_t end = path.find(':', begin);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view dir = path.substr(begin, end - begin);
    const std::string candidate = fmt::format("{}/{}", dir.empty() ? "." : dir, name);
    if (is_executable_file(candidate)) return candidate;
    begin = end + 1;
  }
  throw ValueError(fmt::format(
      "program '{}' was not found in PATH ({}); give a path such as ./{} if it is not installed", name, path, name));
}

}  // namespace dtr::launcher
