// TempPath: removes what it owns (a file, or a directory with what it holds) when it goes,
// unless renamed into place or released; moves hand ownership over; a failed rename keeps it.
#include "core/temp_path.h"

#include <catch2/catch.hpp>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <utility>

#include "core/error.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

namespace fs = std::filesystem;
using testing::MessageContains;

void touch(const fs::path& path) { std::ofstream(path) << "x"; }

TEST_CASE("a TempPath removes its file or directory, with what it holds, however its scope ends", "[temp_path]") {
  const fs::path root = testing::make_temp_dir("temp_path");
  fs::path dir, file = root / "file.tmp";
  {
    const TempPath owned_file(file);
    touch(file);
    TempPath owned_dir = TempPath::make_directory(root, "scratch", "temp_path_test");
    dir = owned_dir.path();
    CHECK(dir.parent_path() == root);
    CHECK(dir.filename().string().starts_with("scratch."));
    REQUIRE(fs::is_directory(dir));
    fs::create_directories(dir / "a" / "b");
    touch(dir / "a" / "b" / "c");
  }
  CHECK_FALSE(fs::exists(file));
  CHECK_FALSE(fs::exists(dir));
  // An exception leaving the scope removes it too: what the owner is for.
  try {
    const TempPath owned(file);
    touch(file);
    throw ValueError("a failure after the file was made");
  } catch (const ValueError&) {}
  CHECK_FALSE(fs::exists(file));
  // A path never created is fine.
  { const TempPath never(root / "never"); }
  CHECK(fs::is_empty(root));
}

TEST_CASE("rename_to and release hand the path on; a move hands the ownership over", "[temp_path]") {
  const fs::path root = testing::make_temp_dir("temp_path");
  {
    TempPath temp(root / "out.tmp");
    touch(temp.path());
    temp.rename_to(root / "out", "temp_path_test");
    CHECK(temp.path().empty());
  }
  CHECK(fs::exists(root / "out"));
  CHECK_FALSE(fs::exists(root / "out.tmp"));

  fs::path kept;
  {
    TempPath temp = TempPath::make_directory(root, "kept", "temp_path_test");
    kept = temp.release();
  }
  CHECK(fs::is_directory(kept));

  {
    TempPath a(root / "moved.tmp");
    touch(a.path());
    TempPath b = std::move(a);
    CHECK(a.path().empty());  // NOLINT(bugprone-use-after-move): a moved-from owner owns nothing
    TempPath c(root / "other.tmp");
    touch(c.path());
    c = std::move(b);  // c's own file goes now, b's is c's
    CHECK_FALSE(fs::exists(root / "other.tmp"));
    CHECK(fs::exists(root / "moved.tmp"));
  }
  CHECK_FALSE(fs::exists(root / "moved.tmp"));
}

TEST_CASE("a failed rename or mkdtemp is an OSError naming the op, and the path stays owned", "[temp_path][errors]") {
  const fs::path root = testing::make_temp_dir("temp_path");
  fs::create_directories(root / "blocked" / "inside");  // a non-empty directory cannot be replaced
  {
    TempPath temp(root / "file.tmp");
    touch(temp.path());
    CHECK_THROWS_MATCHES(
        temp.rename_to(root / "blocked", "save"), OSError,
        MessageContains("save: rename('") && MessageContains("file.tmp") && MessageContains("blocked"));
    CHECK(temp.path() == root / "file.tmp");
  }
  CHECK_FALSE(fs::exists(root / "file.tmp"));
  CHECK_THROWS_MATCHES(TempPath::make_directory(root / "missing", "scratch", "bench"), OSError,
                       MessageContains("bench: mkdtemp(") && MessageContains("No such file"));
}

}  // namespace
}  // namespace dtr
