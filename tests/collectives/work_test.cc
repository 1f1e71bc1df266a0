// Work's two kinds of wait on one thread and another, without a process group: a host
// collective's wait() blocks until finish() (or its timeout); a device collective's wait()
// (a Work with a device_wait hook, as ProcessGroupNCCL makes them) calls the hook instead
// of blocking, rethrows an error already known, and leaves blocking to synchronize(). What a
// finished collective held is freed by the first wait, on the waiter's thread.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "collectives/distributed_error.h"
#include "collectives/work.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using namespace std::chrono_literals;
using testing::MessageContains;

TEST_CASE("A host Work's wait blocks until the collective finishes, then rethrows its error", "[collectives]") {
  Work w("all_reduce #0 on group 'g'", "g", 0, 10s);
  std::thread finisher([w] {
    std::this_thread::sleep_for(50ms);
    w.finish(std::make_exception_ptr(std::runtime_error("peer 1 is gone")));
  });
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_MATCHES(w.wait(), std::runtime_error, MessageContains("peer 1 is gone"));
  CHECK(std::chrono::steady_clock::now() - start >= 40ms);
  CHECK_FALSE(w.waited_on_device());
  finisher.join();
}

TEST_CASE("What a finished collective held is freed by the wait, on the waiter's thread", "[collectives]") {
  Work w("reduce_scatter #0 on group 'g'", "g", 0, 10s);
  std::atomic<bool> freed{false};
  std::thread::id freed_on;
  std::thread finisher([&, w] {
    w.finish(nullptr, std::shared_ptr<void>(new int(0), [&](void* p) {
               delete static_cast<int*>(p);
               freed_on = std::this_thread::get_id();
               freed = true;
             }));
  });
  finisher.join();
  CHECK(w.is_completed());
  CHECK_FALSE(freed);  // finished, not yet waited for: still held
  w.wait();
  CHECK(freed);
  CHECK(freed_on == std::this_thread::get_id());
}

TEST_CASE("A host Work's timed wait gives up with a DistributedError naming the collective", "[collectives]") {
  Work w("broadcast #4 on group 'dp'", "dp", 4, 10s);
  CHECK_THROWS_MATCHES(w.wait(20ms), DistributedError,
                       MessageContains("broadcast #4 on group 'dp'") && MessageContains("did not finish within 20 ms"));
  w.finish();
  CHECK_NOTHROW(w.wait());
}

TEST_CASE("A device Work's wait orders the stream and returns; synchronize blocks the host", "[collectives]") {
  std::atomic<int> stream_waits{0};
  Work w("all_gather #1 on group 'g'", "g", 1, 10s, {}, [&] { ++stream_waits; });

  w.wait();  // running: only the hook
  CHECK(stream_waits == 1);
  CHECK(w.waited_on_device());
  CHECK_FALSE(w.is_completed());
  CHECK_THROWS_AS(w.wait(20ms), DistributedError);  // a timed wait is a host wait

  std::thread finisher([w] {
    std::this_thread::sleep_for(30ms);
    w.finish();
  });
  w.synchronize();
  CHECK(w.is_completed());
  finisher.join();

  w.wait();  // finished: its completion already orders every later stream
  CHECK(stream_waits == 1);
}

TEST_CASE("A failed device Work's wait rethrows the error instead of ordering the stream", "[collectives]") {
  std::atomic<int> stream_waits{0};
  Work w("reduce_scatter #2 on group 'g'", "g", 2, 10s, {}, [&] { ++stream_waits; });
  w.finish(std::make_exception_ptr(
      DistributedError(DistributedErrorKind::kTimeout, "reduce_scatter #2 on group 'g': rank 1 never joined")));
  CHECK_THROWS_MATCHES(w.wait(), DistributedError, MessageContains("rank 1 never joined"));
  CHECK(stream_waits == 0);
  CHECK_FALSE(w.waited_on_device());
  CHECK_THROWS_MATCHES(w.synchronize(), DistributedError, MessageContains("rank 1 never joined"));
}

}  // namespace
}  // namespace dtr
