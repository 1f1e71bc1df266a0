#include "tools/trace/svg.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <utility>

#include "collectives/posix_file.h"
#include "kernels/error.h"

namespace dtr::svg {

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

double nice_step(double range, int target) {
  const double raw = range / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / magnitude;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * magnitude;
}

void write_file_atomically(const std::string& path, std::string_view text, std::string_view op) {
  const std::string temp = path + ".tmp";
  FileDescriptor fd = open_file(temp, O_WRONLY | O_CREAT | O_TRUNC, op);
  // Any failure after the open removes the temporary file, so that only `path` is ever left.
  try {
    write_all(fd.get(), text.data(), text.size(), temp, op);
    sync_and_close(std::move(fd), temp, op);
    if (::rename(temp.c_str(), path.c_str()) != 0) {
      throw OSError(errno, fmt::format("{}: rename('{}', '{}')", op, temp, path));
    }
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
}

}  // namespace dtr::svg
