// LinePrefixer: splitting a byte stream into prefixed lines.
#include "tools/launcher/line_prefixer.h"

namespace dtr::launcher {

std::string LinePrefixer::feed(std::string_view bytes) {
  std::string lines;
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    const size_t room = kMaxLineBytes - pending_.size();
    if (newline == std::string_view::npos && bytes.size() <= room) {
      pending_.append(bytes);
      break;
    }
    // The line ends within `bytes`, or would grow past kMaxLineBytes: emit it either way
    // (a line of exactly kMaxLineBytes keeps its own '\n' when that comes next).
    const size_t take = newline != std::string_view::npos && newline < room ? newline : room;
    lines.append(prefix_).append(pending_).append(bytes.substr(0, take)).push_back('\n');
    pending_.clear();
    bytes.remove_prefix(take < bytes.size() && bytes[take] == '\n' ? take + 1 : take);
  }
  return lines;
}

std::string LinePrefixer::finish() {
  if (pending_.empty()) return {};
  std::string line = prefix_ + pending_ + '\n';
  pending_.clear();
  return line;
}

}  // namespace dtr::launcher
