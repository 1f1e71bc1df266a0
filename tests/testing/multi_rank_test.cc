// The multi-rank harness itself: ranks are real processes with torchrun's environment;
// a rank's failed check, exception, crash or hang fails the test naming that rank.
#include "tests/testing/multi_rank.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <thread>

namespace dtr::testing {
namespace {

TEST_CASE("run_ranks: every rank runs in its own process with torchrun's environment", "[harness]") {
  const pid_t parent = ::getpid();
  run_ranks(3, [&](int rank, int world) {
    CHECK(::getpid() != parent);
    CHECK(std::string(std::getenv("RANK")) == std::to_string(rank));
    CHECK(std::string(std::getenv("WORLD_SIZE")) == std::to_string(world));
    CHECK(std::string(std::getenv("MASTER_ADDR")) == "127.0.0.1");
    CHECK(std::atoi(std::getenv("MASTER_PORT")) > 0);
    CHECK(::getpgid(0) == ::getpid());  // a process group of its own (RankProcess's set-up)
    char c;
    CHECK(::read(STDIN_FILENO, &c, 1) == 0);  // stdin is /dev/null
  });
}

TEST_CASE("run_ranks: a failed check, an exception, a crash, a hang and an exit code are reported with their rank",
          "[harness]") {
  RanksOptions options;
  options.deadline = std::chrono::seconds(3);
  const std::vector<RankOutcome> outcomes = run_ranks_outcomes(
      6,
      [](int rank, int) {
        if (rank == 1) CHECK(rank + 1 == 7);  // a failing check
        if (rank == 2) throw std::runtime_error("boom from rank 2");
        if (rank == 3) ::raise(SIGABRT);
        if (rank == 4) std::this_thread::sleep_for(std::chrono::seconds(60));
        if (rank == 5) ::_exit(3);
      },
      options);
  REQUIRE(outcomes.size() == 6);
  CHECK(outcomes[0].ok);
  CHECK(outcomes[0].report.empty());
  CHECK_FALSE(outcomes[1].ok);
  CHECK_THAT(outcomes[1].report, Catch::Contains("CHECK( rank + 1 == 7 )") && Catch::Contains("2 == 7"));
  CHECK_FALSE(outcomes[2].ok);
  CHECK_THAT(outcomes[2].report, Catch::Contains("boom from rank 2"));
  CHECK_FALSE(outcomes[3].ok);
  CHECK_THAT(outcomes[3].report, Catch::Contains("signal") && Catch::Contains("SIGABRT"));
  CHECK_FALSE(outcomes[4].ok);
  CHECK_THAT(outcomes[4].report, Catch::Contains("harness deadline of 3 s"));
  CHECK_FALSE(outcomes[5].ok);
  CHECK_THAT(outcomes[5].report, Catch::Contains("exited with code 3"));
}

TEST_CASE("run_ranks: a rank the test kills on purpose is not a failure", "[harness]") {
  RanksOptions options;
  options.may_die = {1};
  const std::vector<RankOutcome> outcomes = run_ranks_outcomes(
      2,
      [](int rank, int) {
        if (rank == 1) ::raise(SIGKILL);
      },
      options);
  CHECK(outcomes[0].ok);
  CHECK(outcomes[1].ok);
}

}  // namespace
}  // namespace dtr::testing
