// dtrrun: dtr's torchrun. Starts a program as the ranks of a distributed job on this node.
//
//   dtrrun --nproc-per-node 4 <program> [args...]
//
// It parses torchrun's flags (launch_config.h), resolves the program, picks MASTER_PORT
// and DTR_RUN_ID when they are not given, and runs the local worker group
// (worker_group.h), restarting it up to --max-restarts times after a failure. Exit code:
// 0 when every rank exited 0; the first failing rank's code (or 128 + its signal); 128 + the
// signal when the launcher itself was interrupted; 2 for bad flags; 1 for other errors.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <random>

#include "core/error.h"
#include "tools/launcher/exit_status.h"
#include "tools/launcher/find_program.h"
#include "tools/launcher/free_port.h"
#include "tools/launcher/launch_config.h"
#include "tools/launcher/launcher_log.h"
#include "tools/launcher/launcher_signals.h"
#include "tools/launcher/worker_group.h"

namespace {

using namespace dtr::launcher;

// 64 random bits in hex: distinct for every launch, as torchrun's generated rdzv id is.
std::string make_run_id() {
  std::random_device device;
  const uint64_t bits = (uint64_t{device()} << 32) | device();
  return fmt::format("{:016x}", bits);
}

int run(LaunchConfig config) {
  // `bazel run` starts tools in their runfiles; the user's paths are relative to where
  // they typed the command.
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"); dir != nullptr) {
    if (::chdir(dir) != 0) {
      const int error = errno;
      throw dtr::OSError(error, fmt::format("chdir('{}')", dir));
    }
  }
  const std::string program_path = find_program(config.command.front());
  if (config.master_port == 0) config.master_port = find_free_port(config.master_addr);
  if (config.run_id.empty()) config.run_id = make_run_id();
  if (config.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    // torchrun's default: N ranks each running one OpenMP thread per core overload the node.
    ::setenv("OMP_NUM_THREADS", "1", 1);
    launcher_log("OMP_NUM_THREADS is not set; setting it to 1 for each rank");
  }
  launcher_log(
      "node {} of {}: starting ranks {} .. {} of {}, MASTER_ADDR={} MASTER_PORT={}, "
      "run id {}",
      config.node_rank, config.nnodes, config.global_rank(0), config.global_rank(config.nproc_per_node - 1),
      config.world_size(), config.master_addr, config.master_port, config.run_id);

  LauncherSignals signals;
  for (int restart = 0;; ++restart) {
    const GroupOutcome outcome = WorkerGroup(config, program_path, restart, signals).wait();
    if (outcome.interrupt_signal != 0) {
      launcher_log("stopped by {}", signal_name(outcome.interrupt_signal));
      return 128 + outcome.interrupt_signal;
    }
    if (outcome.succeeded()) return 0;
    if (restart == config.max_restarts) {
      launcher_log("failed after {} attempt(s): {}", restart + 1, outcome.failure->describe());
      return outcome.failure->status.shell_code();
    }
    launcher_log("restarting the local group (restart {} of {})", restart + 1, config.max_restarts);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dtrrun: starts a program as the ranks of a distributed job (torchrun's flags "
      "and environment)",
      "dtrrun"};
  try {
    return run(parse_launch_config(app, argc, argv));
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    launcher_log("error: {} (usage: dtrrun [flags] program [args...]; see dtrrun --help)", e.what());
    return 2;
  } catch (const std::exception& e) {
    launcher_log("error: {}", e.what());
    return 1;
  }
}
