// find_program: execvp's lookup done before forking, and the ValueError for a program that
// cannot be run, naming it (dtrrun prints that message and exits 1).
#include "tools/launcher/find_program.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace {

namespace fs = std::filesystem;
using dtr::launcher::find_program;

// Sets PATH for one scope and restores it after.
class PathGuard {
 public:
  explicit PathGuard(const std::string& path) : saved_(std::getenv("PATH") != nullptr ? std::getenv("PATH") : "") {
    ::setenv("PATH", path.c_str(), 1);
  }
  ~PathGuard() { ::setenv("PATH", saved_.c_str(), 1); }

 private:
  std::string saved_;
};

fs::path temp_dir() {
  const char* root = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(root != nullptr ? root : "/tmp") / "find_program_test";
  fs::create_directories(dir);
  return dir;
}

TEST_CASE("find_program: a name is looked up in PATH in order, a path is taken as it is") {
  const fs::path dir = temp_dir();
  const fs::path tool = dir / "dtr_tool";
  std::ofstream(tool) << "#!/bin/sh\n";
  fs::permissions(tool, fs::perms::owner_all);
  PathGuard path("/nonexistent-dir:" + dir.string() + ":/bin");
  CHECK(find_program("dtr_tool") == tool.string());
  CHECK(find_program(tool.string()) == tool.string());
}

TEST_CASE("find_program: a program that cannot be run is a ValueError naming it") {
  const fs::path dir = temp_dir();
  const fs::path data = dir / "data.txt";
  std::ofstream(data) << "not a program\n";
  PathGuard path(dir.string());
  CHECK_THROWS_AS(find_program(""), dtr::ValueError);
  CHECK_THROWS_WITH(find_program(""), Catch::Contains("empty string"));
  CHECK_THROWS_AS(find_program(data.string()), dtr::ValueError);
  CHECK_THROWS_WITH(find_program(data.string()), Catch::Contains("'" + data.string() + "' is not an executable file"));
  CHECK_THROWS_AS(find_program("data.txt"), dtr::ValueError);  // in PATH, but not executable
  CHECK_THROWS_AS(find_program("no-such-program-dtr"), dtr::ValueError);
  CHECK_THROWS_WITH(find_program("no-such-program-dtr"),
                    Catch::Contains("program 'no-such-program-dtr' was not found in PATH (" + dir.string() + ")"));
}

}  // namespace
