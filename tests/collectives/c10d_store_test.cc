// C10dStore against PyTorch's own TCPStore server (torch.distributed.TCPStore, the store
// torchrun's agent hosts), where torch imports (reported skipped where it does not): set,
// get, add, compare_set, wait, check of a missing key on timeout, num_keys and delete_key,
// each seen by a PyTorch client on the same server. The train program under real torchrun
// is tests/train/train_test.cc's.
#include "collectives/c10d_store.h"

#include <fmt/format.h>
#include <pwd.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "collectives/distributed_error.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

namespace fs = std::filesystem;

// A Python that imports torch ($HOME/torch-venv's, where the notes install PyTorch, or
// python3), else "".
std::string torch_python() {
  const passwd* user = ::getpwuid(::getuid());
  for (const std::string& python :
       {user != nullptr ? std::string(user->pw_dir) + "/torch-venv/bin/python3" : std::string(), std::string("python3")}) {
    if (!python.empty() && std::system((python + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0) return python;
  }
  return "";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// PyTorch's side: serves a TCPStore on a free port (written to `port_file`), sets
// from_torch, waits for dtr's "done", then reads what dtr wrote with its own client.
constexpr const char* kServer = R"(
import sys, datetime
from torch.distributed import TCPStore
port_file, result_file = sys.argv[1], sys.argv[2]
store = TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
store.set("from_torch", "hello from PyTorch")
open(port_file + ".tmp", "w").write(str(store.port))
import os; os.rename(port_file + ".tmp", port_file)
store.wait(["done"])
got = (store.get("from_dtr"), store.add("counter", 0), store.get("swapped"), store.check(["deleted"]))
ok = got == (b"hello from dtr", 12, b"new", False)
open(result_file, "w").write("OK" if ok else repr(got))
)";

TEST_CASE("C10dStore speaks c10d's protocol to PyTorch's TCPStore server", "[c10d_store]") {
  const std::string python = torch_python();
  if (python.empty()) {
    WARN("SKIPPED: torch does not import here (install PyTorch in ~/torch-venv to run this case)");
    return;
  }
  const fs::path dir = testing::make_temp_dir("c10d_store");
  const fs::path script = dir / "server.py", port_file = dir / "port", result_file = dir / "result";
  std::ofstream(script) << kServer;
  REQUIRE(std::system(fmt::format("{} {} {} {} >{} 2>&1 &", python, script.string(), port_file.string(),
                                  result_file.string(), (dir / "server.log").string())
                          .c_str()) == 0);
  for (int i = 0; i < 600 && !fs::exists(port_file); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  INFO(read_text(dir / "server.log"));
  REQUIRE(fs::exists(port_file));
  const auto port = static_cast<uint16_t>(std::stoi(read_text(port_file)));

  C10dStore store("127.0.0.1", port, std::chrono::seconds(30));
  CHECK(store.get("from_torch") == "hello from PyTorch");
  store.set("from_dtr", "hello from dtr");
  CHECK(store.add("counter", 5) == 5);
  CHECK(store.add("counter", 7) == 12);
  CHECK(store.compare_set("swapped", "", "old") == "old");
  CHECK(store.compare_set("swapped", "not it", "x") == "old");
  CHECK(store.compare_set("swapped", "old", "new") == "new");
  store.set("deleted", "soon");
  CHECK(store.delete_key("deleted"));
  CHECK_FALSE(store.delete_key("deleted"));
  CHECK(store.num_keys() >= 4);
  store.wait({"from_torch", "from_dtr"}, std::chrono::seconds(5));
  try {
    store.wait({"from_dtr", "never"}, std::chrono::milliseconds(300));
    FAIL("waiting for a key nobody sets did not time out");
  } catch (const DistributedError& e) {
    CHECK(e.kind() == DistributedErrorKind::kTimeout);
    CHECK_THAT(e.what(), Catch::Contains("keys still missing: ['never']"));
  }
  CHECK(store.get("from_dtr") == "hello from dtr");  // the store still answers after a timeout
  store.set("done", "1");
  for (int i = 0; i < 300 && read_text(result_file).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(read_text(result_file) == "OK");
}

}  // namespace
}  // namespace dtr
