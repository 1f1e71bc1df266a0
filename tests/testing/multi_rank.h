// run_ranks: a Catch2 test body run on N real processes that rendezvous over loopback.
//
// The test process serves a TCP store on a free port and forks one process per rank
// through the launcher's RankProcess (its own process group, killed with the test binary,
// stdin from /dev/null, default signal actions), with torchrun's environment (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True), so
// a body calls dtr::init_process_group(kGloo) as a real program would. In a rank, failed
// CHECKs and REQUIREs and uncaught exceptions are collected and sent to the parent. Unlike
// dtrrun, a failing rank does not stop the others: every rank runs to its end (or the
// deadline, when it is killed and reported as hung), and the test fails naming each rank
// that failed. Ranks never run in the parent, so no test's state leaks between cases.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace dtr::testing {

struct RanksOptions {
  // Ranks still running then are killed (SIGKILL) and reported as hung.
  std::chrono::seconds deadline{180};
  // The default timeout of the groups a rank creates (dtr::set_default_timeout).
  std::chrono::milliseconds group_timeout{30000};
  // Ranks the test itself kills: ending by a signal is their success.
  std::vector<int> may_die;
};

struct RankOutcome {
  int rank = 0;
  bool ok = false;
  std::string report;  // what went wrong ("" when ok)
};

// Runs body(rank, world) in `world` forked processes; one outcome per rank.
std::vector<RankOutcome> run_ranks_outcomes(int world, const std::function<void(int rank, int world)>& body,
                                            const RanksOptions& options = {});

// The same, failing the current test with one message per failed rank.
void run_ranks(int world, const std::function<void(int rank, int world)>& body, const RanksOptions& options = {});

}  // namespace dtr::testing
