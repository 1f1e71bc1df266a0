// LaunchConfig: what dtrrun was asked to do, parsed from torchrun's command line.
//
//   dtrrun [--nproc-per-node N] [--nnodes M] [--node-rank R] [--master-addr A]
//          [--master-port P] [--max-restarts K] [--kill-grace-seconds S] [--run-id ID]
//          program [args...]
//
// torchrun's underscore spellings (--nproc_per_node, ...) are accepted too. Parsing stops
// at the program: everything after it, flags included, belongs to the program ("--" may
// separate the two). A parsed config is valid: N, M >= 1, 0 <= R < M, a port is given
// whenever M > 1 (a free port can only be picked for a single node), K >= 0, 0 <= S <= 3600.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace dtr::launcher {

struct LaunchConfig {
  int nproc_per_node = 1;                 // ranks started on this node
  int nnodes = 1;                         // nodes in the job
  int node_rank = 0;                      // this node's index, 0 .. nnodes-1
  std::string master_addr = "127.0.0.1";  // where rank 0 serves the rendezvous
  int master_port = 0;                    // 0: pick a free port (single node only)
  int max_restarts = 0;                   // restarts of the local group after a failure
  double kill_grace_seconds = 5.0;        // SIGTERM -> SIGKILL delay when stopping ranks
  std::string run_id;                     // DTR_RUN_ID; empty: a fresh one per launch
  std::vector<std::string> command;       // the program and its arguments; never empty

  int world_size() const { return nnodes * nproc_per_node; }
  // RANK of this node's rank `local_rank`.
  int global_rank(int local_rank) const { return node_rank * nproc_per_node + local_rank; }
};

// Parses dtrrun's command line, registering its flags on `app`, a fresh CLI::App that is
// afterwards good only for printing --help. Throws CLI::ParseError: CLI::CallForHelp for
// --help, and for a mistake a message naming the flag, its value and what is legal.
LaunchConfig parse_launch_config(CLI::App& app, int argc, const char* const* argv);

}  // namespace dtr::launcher
