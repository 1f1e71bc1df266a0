// TCPStore and PrefixStore: every command, blocking waits and their timeouts, many
// concurrent clients, and a server that survives malformed and oversized messages.
#include <sys/socket.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "collectives/distributed_error.h"
#include "collectives/internal/socket.h"
#include "collectives/prefix_store.h"
#include "collectives/tcp_store.h"

namespace dtr {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A server on a free loopback port and a client of it.
struct StoreFixture {
  TCPStoreServer server{"127.0.0.1", 0};
  TCPStore store{"127.0.0.1", server.port(), {.timeout = 5s}};
};

// Raw frames, written here independently of the store's own encoder.
void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// True once the server has closed the connection (recv sees end of stream).
bool closed_by_server(int fd) {
  char c;
  const auto deadline = net::Clock::now() + 10s;
  try {
    while (net::recv_exact(fd, &c, 1, deadline, "raw")) {}
  } catch (const DistributedError&) {
    return true;  // "connection closed by peer" (or reset)
  }
  return false;  // deadline passed with the connection still open
}

TEST_CASE("TCPStore: set, get, add, compare_set, delete_key, num_keys", "[store]") {
  StoreFixture f;
  TCPStore& s = f.store;
  s.set("a", "hello");
  CHECK(s.get("a") == "hello");
  s.set("a", std::string("bin\0ary", 7));  // values are bytes, overwrites are allowed
  CHECK(s.get("a") == std::string("bin\0ary", 7));
  s.set("empty", "");
  CHECK(s.get("empty").empty());

  CHECK(s.add("n", 5) == 5);
  CHECK(s.add("n", -7) == -2);
  CHECK(s.get("n") == "-2");

  CHECK(s.compare_set("c", "x", "y").empty());        // missing key, expected not "": unchanged
  CHECK(s.compare_set("c", "", "first") == "first");  // missing key counts as ""
  CHECK(s.compare_set("c", "wrong", "second") == "first");
  CHECK(s.compare_set("c", "first", "second") == "second");
  CHECK(s.get("c") == "second");

  CHECK(s.num_keys() == 4);
  CHECK(s.delete_key("a"));
  CHECK_FALSE(s.delete_key("a"));
  CHECK(s.num_keys() == 3);
  s.wait({"n", "c"}, 1s);  // present keys: returns at once
}

TEST_CASE("TCPStore: add on a key that is not a number throws ValueError", "[store]") {
  StoreFixture f;
  f.store.set("text", "abc");
  CHECK_THROWS_AS(f.store.add("text", 1), ValueError);
  CHECK_THROWS_WITH(f.store.add("text", 1),
                    Catch::Contains("add('text', 1)") && Catch::Contains("not a decimal integer"));
  CHECK(f.store.get("text") == "abc");
}

TEST_CASE("TCPStore: wait and get time out naming the missing keys", "[store]") {
  StoreFixture f;
  f.store.set("here", "1");
  const auto start = Clock::now();
  try {
    f.store.wait({"here", "absent1", "absent2"}, 300ms);
    FAIL("wait returned although two keys never appeared");
  } catch (const DistributedError& e) {
    CHECK(e.kind() == DistributedErrorKind::kTimeout);
    CHECK_THAT(e.what(), Catch::Matchers::Contains("keys still missing: ['absent1', 'absent2']"));
  }
  CHECK(Clock::now() - start >= 300ms);  // it did wait for the timeout
  try {
    f.store.get("nothing", 100ms);
    FAIL("get returned a key that was never set");
  } catch (const DistributedError& e) {
    CHECK(e.kind() == DistributedErrorKind::kTimeout);
    CHECK_THAT(e.what(), Catch::Matchers::Contains("get('nothing')"));
  }
  f.store.set("late", "v");  // the connection is still usable after a timeout
  CHECK(f.store.get("late") == "v");
}

TEST_CASE("TCPStore: a blocked get and wait return when another client sets the keys", "[store]") {
  StoreFixture f;
  std::jthread writer([&] {
    TCPStore other("127.0.0.1", f.server.port());
    std::this_thread::sleep_for(50ms);
    other.set("k1", "one");
    std::this_thread::sleep_for(20ms);
    other.add("k2", 2);
  });
  CHECK(f.store.get("k1", 10s) == "one");
  f.store.wait({"k1", "k2"}, 10s);
  CHECK(f.store.get("k2") == "2");
  writer.join();
}

TEST_CASE("TCPStore: concurrent clients and a client shared between threads", "[store]") {
  StoreFixture f;
  constexpr int kThreads = 8, kAdds = 100;
  std::vector<std::jthread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      TCPStore own("127.0.0.1", f.server.port());
      for (int i = 0; i < kAdds; ++i) {
        own.add("own", 1);
        f.store.add("shared", 2);  // one client, many threads
      }
      own.set(fmt::format("done{}", t), "");
    });
  }
  // A third kind of client waits for them all (a blocked wait holds its own client's
  // connection, so it must not be the shared one).
  std::vector<std::string> done;
  for (int t = 0; t < kThreads; ++t) done.push_back(fmt::format("done{}", t));
  TCPStore("127.0.0.1", f.server.port()).wait(done, 30s);
  for (auto& th : threads) th.join();
  CHECK(f.store.get("own") == std::to_string(kThreads * kAdds));
  CHECK(f.store.add("shared", 0) == 2 * kThreads * kAdds);
}

TEST_CASE("TCPStore: malformed and oversized messages close only that connection", "[store]") {
  StoreFixture f;
  f.store.set("before", "1");
  struct Case {
    const char* what;
    std::string bytes;
  };
  std::vector<Case> cases;
  {
    std::string oversized;
    put_u32(oversized, 0xffffffffu);  // announces 4 GiB
    oversized += "xxxx";
    cases.push_back({"oversized length", oversized});
    std::string unknown;
    put_u32(unknown, 3);
    unknown += "\x7f\x01\x02";  // command 127 does not exist
    cases.push_back({"unknown command", unknown});
    std::string truncated;
    put_u32(truncated, 1 + 4 + 3);
    truncated.push_back(1);   // set
    put_u32(truncated, 100);  // a key of 100 bytes, but only 3 follow
    truncated += "abc";
    cases.push_back({"field past the end", truncated});
    std::string trailing;
    put_u32(trailing, 1 + 1);
    trailing.push_back(7);  // num_keys takes no fields
    trailing.push_back('z');
    cases.push_back({"trailing bytes", trailing});
    std::string empty;
    put_u32(empty, 0);
    cases.push_back({"empty message", empty});
  }
  int64_t rejected = 0;
  for (const Case& c : cases) {
    INFO(c.what);
    FileDescriptor raw = net::connect_tcp("127.0.0.1", f.server.port(), net::Clock::now() + 5s);
    net::send_all(raw.get(), c.bytes.data(), c.bytes.size(), "raw");
    CHECK(closed_by_server(raw.get()));
    CHECK(f.server.rejected_connections() == ++rejected);
    // Everyone else is still served.
    CHECK(f.store.add("after", 1) == rejected);
    CHECK(f.store.get("before") == "1");
  }
  // A client that connects and vanishes mid-frame harms nobody either.
  {
    FileDescriptor raw = net::connect_tcp("127.0.0.1", f.server.port(), net::Clock::now() + 5s);
    std::string partial;
    put_u32(partial, 1000);
    partial += "abc";
    net::send_all(raw.get(), partial.data(), partial.size(), "raw");
  }
  CHECK(f.store.get("before") == "1");
  CHECK(f.server.rejected_connections() == rejected);
}

TEST_CASE("TCPStore: a request over the size limit is refused before it is sent", "[store]") {
  StoreFixture f;
  const std::string huge(TCPStore::kMaxMessageBytes, 'x');
  CHECK_THROWS_AS(f.store.set("big", huge), ValueError);
  CHECK_THROWS_WITH(f.store.set("big", huge), Catch::Contains("over the store's limit"));
  f.store.set("small", "ok");
  CHECK(f.store.get("small") == "ok");
}

TEST_CASE("TCPStore: is_server serves from the client's process on a free port", "[store]") {
  TCPStore master("127.0.0.1", 0, {.is_server = true, .timeout = 5s});
  REQUIRE(master.port() != 0);
  TCPStore client("127.0.0.1", master.port());
  client.set("x", "from client");
  CHECK(master.get("x") == "from client");
}

TEST_CASE("TCPStore: no server, or a server that went away, is a DistributedError", "[store]") {
  uint16_t port;
  {
    TCPStoreServer probe("127.0.0.1", 0);
    port = probe.port();
  }
  try {
    TCPStore s("127.0.0.1", port, {.timeout = 200ms});
    FAIL("connected to a port with no server");
  } catch (const DistributedError& e) {
    CHECK(e.kind() == DistributedErrorKind::kTimeout);
    CHECK_THAT(e.what(), Catch::Matchers::Contains(fmt::format("127.0.0.1:{}", port)));
  }
  auto server = std::make_unique<TCPStoreServer>("127.0.0.1", 0);
  TCPStore s("127.0.0.1", server->port(), {.timeout = 300ms});
  s.set("k", "v");
  server.reset();
  try {
    s.get("k");
    FAIL("a store whose server is gone answered");
  } catch (const DistributedError& e) {
    CHECK(e.kind() == DistributedErrorKind::kStore);
    CHECK_THAT(e.what(), Catch::Matchers::Contains("get('k')"));
  }
}

TEST_CASE("PrefixStore: keys are isolated per prefix and nest", "[store]") {
  StoreFixture f;
  auto base = std::shared_ptr<Store>(&f.store, [](Store*) {});
  auto a = std::make_shared<PrefixStore>("a", base);
  PrefixStore b("b", base);
  PrefixStore ab("b", a);
  a->set("k", "in a");
  b.set("k", "in b");
  ab.set("k", "in a/b");
  CHECK(a->get("k") == "in a");
  CHECK(b.get("k") == "in b");
  CHECK(f.store.get("a/b/k") == "in a/b");
  CHECK(a->add("n", 3) == 3);
  CHECK(f.store.get("a/n") == "3");
  CHECK(b.compare_set("k", "in b", "changed") == "changed");
  CHECK(a->get("k") == "in a");
  try {
    b.wait({"n"}, 100ms);
    FAIL("b saw a's key");
  } catch (const DistributedError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("'b/n'"));
  }
  CHECK(b.delete_key("k"));
  CHECK(a->get("k") == "in a");
  CHECK(b.num_keys() == f.store.num_keys());
}

}  // namespace
}  // namespace dtr
