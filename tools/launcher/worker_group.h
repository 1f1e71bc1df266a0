// WorkerGroup: one attempt of this node's ranks, from their start to the last one's exit
// (torchrun's LocalElasticAgent with its worker group is the model).
//
// It starts nproc_per_node ranks with torchrun's environment (node n's ranks are RANK =
// n * nproc_per_node + LOCAL_RANK), relays each rank's stdout and stderr line by line with a
// "[rank<RANK>]: " prefix, and watches exits and signals in one poll() loop. The first rank
// that exits non-zero or is killed is the failure: the others get SIGTERM, then SIGKILL after
// the grace period. SIGINT/SIGTERM sent to the launcher is forwarded to every rank, with the
// same grace period (a second one kills at once). A WorkerGroup destroyed early (an
// exception) kills and reaps whatever it started.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/file_descriptor.h"
#include "tools/launcher/exit_status.h"
#include "tools/launcher/launch_config.h"
#include "tools/launcher/launcher_signals.h"
#include "tools/launcher/line_prefixer.h"
#include "tools/launcher/rank_process.h"

namespace dtr::launcher {

// The rank whose exit made the group stop.
struct RankFailure {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  ExitStatus status;

  // "rank 1 (local rank 1, pid 1234) exited with code 3".
  std::string describe() const;
};

// How one attempt ended: success, the first failure, or a signal to the launcher.
struct GroupOutcome {
  std::optional<RankFailure> failure;  // the first rank that failed before any stop began
  int interrupt_signal = 0;            // SIGINT or SIGTERM received by the launcher, or 0

  bool succeeded() const { return !failure && interrupt_signal == 0; }
};

class WorkerGroup {
 public:
  // Starts the ranks of `config` (its master_port and run_id already chosen), running
  // `program_path`, as attempt `restart_count` (DTR_RESTART_COUNT). Ranks get the launcher's
  // environment with torchrun's variables set (--nnodes 2 --nproc-per-node 2: node 0 runs
  // RANK 0 and 1, node 1 RANK 2 and 3).
  WorkerGroup(const LaunchConfig& config, const std::string& program_path, int restart_count, LauncherSignals& signals);

  // Relays output and handles exits and signals until every rank has ended; returns only
  // once every rank has been reaped and its output relayed.
  GroupOutcome wait();

 private:
  struct Worker {
    int rank;
    int local_rank;
    RankProcess process;
  };
  // One of a rank's two output pipes, relayed to the launcher's own stdout or stderr.
  struct OutputStream {
    FileDescriptor pipe;
    LinePrefixer prefixer;
    int destination;
  };

  void handle_signal(int signal, GroupOutcome& outcome);
  void reap_exited(GroupOutcome& outcome);
  void relay(OutputStream& stream);
  // Sends `signal` to every running rank and starts the grace period before SIGKILL.
  void stop(int signal);
  // Sends SIGKILL to every running rank.
  void kill_running();
  int running_count() const;

  LauncherSignals& signals_;
  std::chrono::steady_clock::duration kill_grace_;
  std::vector<Worker> workers_;
  std::vector<OutputStream> streams_;
  bool stopping_ = false;
  int stop_signal_ = 0;  // what stop() sent
  bool killed_ = false;
  std::chrono::steady_clock::time_point kill_deadline_;  // when stopping_: SIGKILL is due
};

}  // namespace dtr::launcher
