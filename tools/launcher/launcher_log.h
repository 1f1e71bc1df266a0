// launcher_log: dtrrun's own messages, one "[dtrrun] ..." line each on stderr.
//
// The prefix keeps them apart from the ranks' lines ("[rank3]: ..."), which share the
// launcher's stdout and stderr. Each message is formatted first and written in one call,
// so it never splits a rank's line or is split by one.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <utility>

namespace dtr::launcher {

// Prints "[dtrrun] <formatted message>\n" to stderr.
template <class... Args>
void launcher_log(fmt::format_string<Args...> format, Args&&... args) {
  fmt::print(stderr, "[dtrrun] {}\n", fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace dtr::launcher
