// RankProcess: one rank, a child process that the launcher owns from fork to reap.
//
// The child runs in a process group of its own (so a signal for the rank reaches anything
// it started, and a terminal's Ctrl-C reaches only the launcher, which forwards it), dies
// with the launcher (PR_SET_PDEATHSIG = SIGKILL, so no rank outlives a killed launcher),
// reads stdin from /dev/null and writes stdout/stderr to the descriptors it is given.
// A RankProcess that is destroyed while its child still runs kills the child's group and
// reaps it, so an exception on any path leaves no rank behind. torchrun starts workers
// the same way (a new session per worker, pdeathsig on Linux).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "tools/launcher/exit_status.h"

namespace dtr::launcher {

class RankProcess {
 public:
  // Starts `path` with `argv` (argv[0] included) and the environment `env` ("NAME=value"
  // entries), signal mask `mask` and default signal actions, with stdout and stderr on
  // `stdout_fd` and `stderr_fd`. Throws OSError, naming `path`, if it cannot start.
  RankProcess(const std::string& path, const std::vector<std::string>& argv,
              const std::vector<std::string>& env, const sigset_t& mask, int stdout_fd,
              int stderr_fd);
  RankProcess(RankProcess&& other) noexcept;
  RankProcess& operator=(RankProcess&&) = delete;
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;
  ~RankProcess();

  pid_t pid() const { return pid_; }
  // True until reap() has collected the child.
  bool running() const { return pid_ > 0; }
  // Sends `signal` to the rank's process group (the rank and anything it started).
  void signal_group(int signal) const;
  // Collects the child and returns how it ended, after first killing whatever is left of
  // its process group. Call it only once waitid() has reported that the child terminated.
  ExitStatus reap();

 private:
  pid_t pid_ = -1;
};

}  // namespace dtr::launcher
