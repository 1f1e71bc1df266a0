// Sub-groups: new_group(ranks) and split_group(colour), as a 2-D mesh uses them, on real
// rank processes; the world served by rank 0's own store when no launcher serves one;
// re-initialising after destroy_process_group.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "collectives/collective_counter.h"
#include "collectives/init.h"
#include "collectives/tcp_store.h"
#include "kernels/fill.h"
#include "tests/testing/multi_rank.h"

namespace dtr {
namespace {

using testing::run_ranks;

double sum_all_reduce(ProcessGroup& pg, double value) {
  Tensor t = full({3}, value, kFloat64);
  pg.all_reduce(t).wait();
  return t.narrow(0, 0, 1).item();
}

TEST_CASE("new_group: members get a group over their ranks, the others nullptr", "[collectives][subgroups]") {
  run_ranks(4, [](int rank, int) {
    init_process_group(Backend::kGloo);
    auto even = new_group({2, 0});  // sorted, like PyTorch: group rank 0 is world rank 0
    auto odd = new_group({1, 3});
    auto& mine = rank % 2 == 0 ? even : odd;
    auto& other = rank % 2 == 0 ? odd : even;
    REQUIRE(mine != nullptr);
    CHECK(other == nullptr);
    CHECK(mine->size() == 2);
    CHECK(mine->rank() == rank / 2);
    CHECK(mine->global_ranks() == (rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
    CHECK(mine->name() == (rank % 2 == 0 ? "group0" : "group1"));
    collective_counter().reset();
    // Sum of (world rank + 1) over the members only.
    CHECK(sum_all_reduce(*mine, rank + 1.0) == (rank % 2 == 0 ? 1 + 3 : 2 + 4));
    CHECK(sum_all_reduce(*default_group(), rank + 1.0) == 10);
    const auto rows = collective_counter().snapshot();
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].group == "default_pg");
    CHECK(rows[1].group == mine->name());
    CHECK_THROWS_AS(new_group({0, 0, 1}), ValueError);
    CHECK_THROWS_WITH(new_group({0, 4}), Catch::Contains("distinct world ranks in [0, 4)"));
  });
}

TEST_CASE("split_group: the rows and columns of a 2x2 mesh, used concurrently", "[collectives][subgroups]") {
  run_ranks(4, [](int rank, int) {
    auto world = init_process_group(Backend::kGloo);
    // Mesh coordinate (rank / 2, rank % 2): a row keeps rank / 2 fixed, a column rank % 2.
    auto row = split_group(*world, rank / 2);
    auto col = split_group(*world, rank % 2);
    REQUIRE(row != nullptr);
    REQUIRE(col != nullptr);
    CHECK(row->global_ranks() == std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1});
    CHECK(col->global_ranks() == std::vector<int>{rank % 2, rank % 2 + 2});
    CHECK(row->rank() == rank % 2);
    CHECK(col->rank() == rank / 2);
    CHECK(row->name() == fmt::format("default_pg/split0/colour{}", rank / 2));
    // Issue on both before waiting on either: each group has its own thread and connections.
    Tensor r = full({5}, rank + 1.0, kFloat32);
    Tensor c = full({5}, rank + 1.0, kFloat32);
    Work wr = row->all_reduce(r);
    Work wc = col->all_reduce(c);
    wc.wait();
    wr.wait();
    CHECK(r.narrow(0, 0, 1).item() == (rank / 2 == 0 ? 1 + 2 : 3 + 4));
    CHECK(c.narrow(0, 0, 1).item() == (rank % 2 == 0 ? 1 + 3 : 2 + 4));
    // A split of a split, and a negative colour that joins nothing.
    auto alone = split_group(*row, row->rank());
    REQUIRE(alone != nullptr);
    CHECK(alone->size() == 1);
    CHECK(alone->global_ranks() == std::vector<int>{rank});
    CHECK(sum_all_reduce(*alone, 7.0) == 7.0);
    auto some = split_group(*world, rank == 3 ? -1 : 0);
    CHECK((rank == 3) == (some == nullptr));
    if (some) CHECK(sum_all_reduce(*some, 1.0) == 3.0);
  });
}

TEST_CASE("init_process_group: rank 0 serves the store when no launcher does; init again after destroy",
          "[collectives][subgroups]") {
  uint16_t port;
  {
    TCPStoreServer probe("127.0.0.1", 0);  // a port that was free a moment ago
    port = probe.port();
  }
  run_ranks(3, [port](int rank, int n) {
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    auto pg = init_process_group(Backend::kGloo);
    CHECK(is_initialized());
    CHECK(pg->rank() == rank);
    CHECK(pg->size() == n);
    CHECK(sum_all_reduce(*pg, 1.0) == n);
    CHECK_THROWS_WITH(init_process_group(Backend::kGloo), Catch::Contains("already exists"));
    // Everyone is done with rank 0's store before rank 0 (its server) leaves.
    pg->barrier().wait();
    destroy_process_group();
    CHECK_FALSE(is_initialized());
    CHECK_THROWS_WITH(default_group(), Catch::Contains("init_process_group first"));
  });
  run_ranks(2, [](int rank, int n) {
    // A second init in one process gets a fresh prefix of the same store.
    auto first = init_process_group(Backend::kGloo);
    CHECK(sum_all_reduce(*first, 1.0) == n);
    first.reset();
    destroy_process_group();
    auto second = init_process_group(Backend::kGloo);
    CHECK(sum_all_reduce(*second, rank + 1.0) == 3.0);
  });
}

TEST_CASE("init_process_group: a missing environment variable is a ValueError naming it", "[collectives][subgroups]") {
  run_ranks(1, [](int, int) {
    unsetenv("MASTER_PORT");
    CHECK_THROWS_AS(init_process_group(Backend::kGloo), ValueError);
    CHECK_THROWS_WITH(init_process_group(Backend::kGloo), Catch::Contains("MASTER_PORT is not set"));
    setenv("MASTER_PORT", "eleven", 1);
    CHECK_THROWS_WITH(init_process_group(Backend::kGloo), Catch::Contains("MASTER_PORT=\"eleven\" is not an integer"));
  });
}

}  // namespace
}  // namespace dtr
