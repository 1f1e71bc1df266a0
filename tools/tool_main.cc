// tool_main: one catch, one line, exit code 1.
#include "tools/tool_main.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "collectives/launch_env.h"

namespace dtr {
namespace {

// "[rank 3] " in a rank process, "" otherwise.
std::string rank_prefix() {
  const char* rank = std::getenv("RANK");
  if (rank == nullptr || std::getenv("WORLD_SIZE") == nullptr) return "";
  return fmt::format("[rank {}] ", rank);
}

}  // namespace

int tool_main(std::string_view tool, const std::function<int()>& body) {
  try {
    adopt_launcher_env();
    return body();
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}{}: {}\n", rank_prefix(), tool, e.what());
  } catch (...) {
    fmt::print(stderr, "{}{}: an exception that is not a std::exception\n", rank_prefix(), tool);
  }
  std::fflush(stderr);
  return 1;
}

}  // namespace dtr
