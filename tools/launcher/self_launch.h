// launch_self: starts this very program as the ranks of a one-node job, for tools that
// launch their own ranks (`explain_sharding --execute`, `redistribute_bench`,
// `collective_bench`) instead of being started by dtrrun.
//
// The calling process becomes the launcher: it re-executes its own binary with the same
// arguments as `nproc` ranks through dtrrun's WorkerGroup, so every rank gets torchrun's
// environment (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT, ...), its lines
// carry a "[rank<k>]: " prefix, and the first rank to fail stops the others. The program
// tells the two roles apart with is_rank_process(); under dtrrun it is a rank from the start.
#pragma once

#include <span>
#include <string>

namespace dtr::launcher {

// Whether this process runs as a rank: RANK and WORLD_SIZE are set (by dtrrun, torchrun or
// launch_self).
bool is_rank_process();

// How the ranks ended: exit_code 0 when every rank exited 0; otherwise the first failing
// rank's code (or 128 + its signal), with `failure` saying which rank and how ("rank 2
// (local rank 2, pid 31337) exited with code 1"), or that the launcher was interrupted.
struct SelfLaunchResult {
  int exit_code = 0;
  std::string failure;
};

// Runs this program with `argv` (argv[0] included) as `nproc` ranks (>= 1) and waits for
// all of them. Throws OSError when the ranks cannot be started.
SelfLaunchResult launch_self(int nproc, std::span<char* const> argv);

}  // namespace dtr::launcher
