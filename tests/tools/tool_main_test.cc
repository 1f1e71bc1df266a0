// tool_main, the one catch of every tool's main: the body's exit code passes through; an
// exception becomes one line on stderr, "[rank k] " prefixed in a rank process, and exit 1.
#include "tools/tool_main.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "collectives/distributed_error.h"
#include "core/error.h"

namespace {

// Runs tool_main with stderr sent to a pipe; returns the exit code and sets `err`.
int run_capturing_stderr(const std::function<int()>& body, std::string& err) {
  int ends[2];
  REQUIRE(::pipe2(ends, O_CLOEXEC) == 0);
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(ends[1], STDERR_FILENO);
  ::close(ends[1]);
  const int code = dtr::tool_main("some_tool", body);
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  err.clear();
  char buffer[256];
  ssize_t n;
  while ((n = ::read(ends[0], buffer, sizeof buffer)) > 0) err.append(buffer, static_cast<size_t>(n));
  ::close(ends[0]);
  return code;
}

TEST_CASE("tool_main: the body's exit code passes through, and nothing is printed") {
  ::unsetenv("RANK");
  std::string err;
  CHECK(run_capturing_stderr([] { return 0; }, err) == 0);
  CHECK(run_capturing_stderr([] { return 3; }, err) == 3);
  CHECK(err.empty());
}

TEST_CASE("tool_main: an exception is one line naming the tool, and exit code 1") {
  ::unsetenv("RANK");
  std::string err;
  CHECK(run_capturing_stderr([]() -> int { throw dtr::ValueError("--shape 0: sizes must be positive"); }, err) == 1);
  CHECK(err == "some_tool: --shape 0: sizes must be positive\n");
  CHECK(run_capturing_stderr([]() -> int { throw 42; }, err) == 1);
  CHECK(err == "some_tool: an exception that is not a std::exception\n");
}

TEST_CASE("tool_main: in a rank process the line starts with the rank") {
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  std::string err;
  const int code = run_capturing_stderr(
      []() -> int { throw dtr::DistributedError(dtr::DistributedErrorKind::kTimeout, "all_reduce #3 timed out"); },
      err);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  CHECK(code == 1);
  CHECK(err == "[rank 2] some_tool: all_reduce #3 timed out\n");
}

}  // namespace
