// Failures on real rank processes: a rank that never joins, a rank absent from a
// collective, a rank killed in the middle of one, and a wait() shorter than a collective.
// The survivors must fail within the (short) timeout with a DistributedError that names
// the group, the collective, its sizes and the peer; nothing may hang.
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <thread>

#include "collectives/distributed_error.h"
#include "collectives/init.h"
#include "kernels/fill.h"
#include "tests/testing/multi_rank.h"

namespace dtr {
namespace {

using namespace std::chrono_literals;
using testing::RanksOptions;
using testing::run_ranks;

RanksOptions short_timeouts(std::vector<int> may_die = {}) {
  RanksOptions o;
  o.deadline = std::chrono::seconds(60);
  o.group_timeout = 2000ms;
  o.may_die = std::move(may_die);
  return o;
}

// Runs f, which must throw a DistributedError; returns it.
template <class F>
DistributedError distributed_error_of(F&& f) {
  try {
    f();
  } catch (const DistributedError& e) {
    return e;
  }
  FAIL("expected a DistributedError");
  throw;  // unreachable: FAIL throws
}

TEST_CASE("a rank that never joins makes init_process_group fail on the others", "[collectives][failure]") {
  run_ranks(
      3,
      [](int rank, int) {
        if (rank == 2) return;  // never calls init_process_group
        DistributedError e = distributed_error_of([] { init_process_group(Backend::kGloo); });
        CHECK(e.kind() == DistributedErrorKind::kTimeout);
        CHECK_THAT(e.what(), Catch::Contains("group 'default_pg'") && Catch::Contains("group rank(s) [2]") &&
                                 Catch::Contains("did not join within 2000 ms"));
      },
      short_timeouts());
}

TEST_CASE("a RANK outside WORLD_SIZE is refused before any store is reached", "[collectives][failure]") {
  // No rank 0 serves this port: a store connection would wait out the timeout and blame it.
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "1", 1);
  CHECK_THROWS_MATCHES(init_process_group(Backend::kGloo), ValueError,
                       Catch::Matchers::Message("init_process_group: rank 5 is not in [0, 2) for a world of 2 ranks"));
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(name);
}

// 1 Ki floats take the all_reduce's gather path; 256 Ki floats (1 MiB) dtr's ring, whose
// waits on Gloo's bound buffers give up after the group's timeout too.
TEST_CASE("a rank absent from a collective makes it time out on the others, naming the rank",
          "[collectives][failure]") {
  for (int64_t count : {int64_t{1024}, int64_t{1} << 18}) {
    run_ranks(
        3,
        [count](int rank, int) {
          auto pg = init_process_group(Backend::kGloo);
          if (rank == 2) {  // alive but never issues the all_reduce: waits until the others are done
            pg->store()->wait({"test/survivors_done"}, 60s);
            return;
          }
          Tensor x = full({count}, 1.0, kFloat32);
          Work w = pg->all_reduce(x);
          DistributedError e = distributed_error_of([&] { w.wait(); });
          // The first survivor to time out closes its connections, so the other may see that first.
          CHECK((e.kind() == DistributedErrorKind::kTimeout || e.kind() == DistributedErrorKind::kConnection));
          CHECK_THAT(e.what(), Catch::Contains("all_reduce #0 on group 'default_pg'") &&
                                   Catch::Contains(fmt::format("float32[{}]", count)) &&
                                   Catch::Contains("peer group rank(s) [2]"));
          CHECK(w.is_completed());
          CHECK(w.exception() != nullptr);
          // The group is unusable now; later collectives fail at once, pointing at the first failure.
          DistributedError later = distributed_error_of([&] { pg->barrier().wait(); });
          CHECK_THAT(later.what(), Catch::Contains("barrier #1") && Catch::Contains("failed earlier") &&
                                       Catch::Contains("all_reduce #0"));
          pg->store()->add("test/survivors", 1);
          if (pg->store()->add("test/survivors", 0) == 2) pg->store()->set("test/survivors_done", "");
        },
        short_timeouts());
  }
}

TEST_CASE("a rank killed in the middle of a collective makes it fail on the others, naming the rank",
          "[collectives][failure]") {
  run_ranks(
      3,
      [](int rank, int n) {
        auto pg = init_process_group(Backend::kGloo);
        Tensor x = full({16 << 20}, 1.0, kFloat32);  // 64 MiB: tens of milliseconds on the wire
        pg->all_reduce(x).wait();                    // everyone connected and working
        if (rank == 2) {
          std::this_thread::sleep_for(50ms);  // the others are in the collective by now
          std::thread([] {
            std::this_thread::sleep_for(2ms);
            ::raise(SIGKILL);
          }).detach();
          pg->all_reduce(x).wait();
          FAIL("rank 2 should have been killed");
        }
        Work w = pg->all_reduce(x);
        DistributedError e = distributed_error_of([&] { w.wait(); });
        // A closed connection, seen before the timeout (or, if this rank was still waiting
        // on a live peer that failed first, that peer's timeout).
        CHECK((e.kind() == DistributedErrorKind::kConnection || e.kind() == DistributedErrorKind::kTimeout));
        // Rank 2 is named (a survivor slowed by the machine's load past the diagnosis' grace may be too).
        CHECK_THAT(e.what(), Catch::Contains("all_reduce #1 on group 'default_pg'") &&
                                 Catch::Contains("float32[16777216]") &&
                                 Catch::Matches(".*peer group rank\\(s\\) \\[(0, |1, )?2\\].*"));
        (void)n;
      },
      short_timeouts({2}));
}

TEST_CASE("Work::wait(timeout) gives up on a slow collective, which still completes", "[collectives][failure]") {
  RanksOptions options = short_timeouts();
  options.group_timeout = 20000ms;
  run_ranks(
      2,
      [](int rank, int) {
        auto pg = init_process_group(Backend::kGloo);
        Tensor x = full({8}, rank + 1.0, kFloat64);
        if (rank == 1) std::this_thread::sleep_for(1500ms);
        Work w = pg->all_reduce(x);
        if (rank == 0) {
          DistributedError e = distributed_error_of([&] { w.wait(200ms); });
          CHECK(e.kind() == DistributedErrorKind::kTimeout);
          CHECK_THAT(e.what(), Catch::Contains("all_reduce #0") && Catch::Contains("did not finish within 200 ms"));
        }
        w.wait();
        CHECK(x.narrow(0, 0, 1).item() == 3.0);
      },
      options);
}

}  // namespace
}  // namespace dtr
