// C10dStore against c10d's TCPStore protocol, two ways: replaying the exchange of PyTorch's
// own client and server (tests/collectives/testdata/c10d_store_exchange.json, recorded by
// tests/collectives/testdata/make_c10d_store_testdata.py), byte for byte, without torch; and against PyTorch's
// TCPStore server itself (the store torchrun's agent hosts), where torch imports (reported
// skipped where it does not): set, get, add, compare_set, wait, a timed-out wait naming the
// missing key, num_keys and delete_key, each seen by a PyTorch client on the same server.
// The train program under real torchrun is tests/train/train_test.cc's.
#include "collectives/c10d_store.h"

#include <fmt/format.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collectives/distributed_error.h"
#include "collectives/internal/socket.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

namespace fs = std::filesystem;

// A Python that imports torch ($HOME/torch-venv's, where the notes install PyTorch, or
// python3), else "".
std::string torch_python() {
  const passwd* user = ::getpwuid(::getuid());
  for (const std::string& python :
       {user != nullptr ? std::string(user->pw_dir) + "/torch-venv/bin/python3" : std::string(),
        std::string("python3")}) {
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

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

constexpr char kWaitQuery = 6;

// The bytes of the WAIT query that opens `request`: the query byte, a u64 key count, and
// each key as a u64 length and its bytes.
size_t wait_query_size(const std::string& request) {
  const auto u64_at = [&](size_t at) {
    uint64_t v = 0;
    std::memcpy(&v, request.data() + at, sizeof(v));
    return static_cast<size_t>(v);
  };
  size_t at = 1 + 8;
  for (size_t k = 0, n = u64_at(1); k < n; ++k) at += 8 + u64_at(at);
  return at;
}

TEST_CASE("C10dStore sends what PyTorch's client sends and reads what PyTorch's server answers", "[c10d_store]") {
  const nlohmann::json exchange =
      nlohmann::json::parse(read_text("tests/collectives/testdata/c10d_store_exchange.json"));
  const nlohmann::json& operations = exchange.at("operations");
  // A server that answers each recorded request with the recorded reply, and notes the
  // first request that differs.
  FileDescriptor listener = net::listen_tcp("127.0.0.1", 0);
  const uint16_t port = net::local_port(listener.get());
  std::string mismatch;
  std::thread server([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    FileDescriptor conn;
    while (!conn.valid() && std::chrono::steady_clock::now() < deadline) {
      conn = FileDescriptor(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn.valid()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // The opening: VALIDATE and the magic number, as PyTorch's client opens (it then pings).
    const std::string opening = from_hex(exchange.at("opening").at("request").get<std::string>()).substr(0, 5);
    std::string got(opening.size(), '\0');
    if (!net::recv_exact(conn.get(), got.data(), got.size(), deadline, "replay") || got != opening) {
      mismatch = "the opening";
      return;
    }
    // Each operation's request and reply, in turns: a get is a WAIT answered before its GET.
    for (const nlohmann::json& op : operations) {
      const std::string request = from_hex(op.at("request").get<std::string>());
      const std::string reply = from_hex(op.at("reply").get<std::string>());
      std::vector<std::pair<std::string, std::string>> turns = {{request, reply}};
      if (request[0] == kWaitQuery && reply.size() > 1) {
        const size_t wait_size = wait_query_size(request);
        turns = {{request.substr(0, wait_size), reply.substr(0, 1)}, {request.substr(wait_size), reply.substr(1)}};
      }
      for (const auto& [expected, answer] : turns) {
        std::string sent(expected.size(), '\0');
        if (!net::recv_exact(conn.get(), sent.data(), sent.size(), deadline, "replay") || sent != expected) {
          mismatch = op.at("op").get<std::string>();
          return;
        }
        net::send_all(conn.get(), answer.data(), answer.size(), "replay");
      }
    }
  });
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();  // also when the client throws
    }
  } joiner{server};
  {
    C10dStore store("127.0.0.1", port, std::chrono::seconds(10));
    store.set("k", "v");
    CHECK(store.get("k") == "v");
    CHECK(store.add("n", 5) == 5);
    CHECK(store.add("n", 7) == 12);
    CHECK(store.compare_set("s", "", "a") == "a");
    CHECK(store.compare_set("s", "x", "b") == "a");
    store.wait({"k", "n"});
    CHECK(store.num_keys() == 4);
    CHECK(store.delete_key("k"));
    CHECK_FALSE(store.delete_key("k"));
  }
  server.join();
  INFO("first request that differs from PyTorch's: " << mismatch);
  CHECK(mismatch.empty());
  CHECK(operations.size() == 10);
}

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
