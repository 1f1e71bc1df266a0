// RankProcess: one rank, a child process that the launcher owns from fork to reap.
//
// The child runs in a process group of its own (so a signal for the rank reaches anything
// it started, and a terminal's Ctrl-C reaches only the launcher, which forwards it), dies
// with the launcher (PR_SET_PDEATHSIG = SIGKILL, so no rank outlives a killed launcher),
// reads stdin from /dev/null, writes stdout/stderr to the descriptors it is given and
// starts with default signal actions. It then either execs a program (dtrrun's ranks) or
// runs a function in the forked child (the multi-rank test harness's ranks); both get the
// same set-up. A RankProcess that is destroyed while its child still runs kills the
// child's group and reaps it, so an exception on any path leaves no rank behind. torchrun
// starts workers the same way (a new session per worker, pdeathsig on Linux).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "tools/launcher/exit_status.h"

namespace dtr::launcher {

class RankProcess {
 public:
  // Starts `path` with `argv` (argv[0] included) and the environment `env` ("NAME=value"
  // entries), signal mask `mask` and default signal actions, with stdout and stderr on
  // `stdout_fd` and `stderr_fd`. Throws OSError, naming `path`, if it cannot start.
  RankProcess(const std::string& path, const std::vector<std::string>& argv, const std::vector<std::string>& env,
              const sigset_t& mask, int stdout_fd, int stderr_fd);
  // Runs `body` in a forked child with the same set-up (the parent's environment; handlers
  // the parent installed are reset to the default action, as exec would reset them). The
  // child exits with body's return value, through _exit(): the parent's atexit handlers and
  // static destructors never run in it. An exception escaping `body` is written to the
  // child's stderr and makes it exit with 1. stdio buffers are flushed before the fork, so
  // the child cannot write the parent's pending output again. Throws OSError if the child
  // cannot be started.
  RankProcess(const std::function<int()>& body, const sigset_t& mask, int stdout_fd, int stderr_fd);
  RankProcess(RankProcess&& other) noexcept;
  RankProcess& operator=(RankProcess&&) = delete;
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;
  ~RankProcess();

  pid_t pid() const { return pid_; }
  // True until reap() has collected the child.
  bool running() const { return pid_ > 0; }
  // Whether the child has terminated (it stays a zombie, unreaped, until reap()). Does not wait.
  bool terminated() const;
  // Sends `signal` to the rank's process group (the rank and anything it started).
  void signal_group(int signal) const;
  // Kills whatever is left of the rank's process group (the rank too, if it still runs),
  // then collects the rank and returns how it ended. Once the rank has terminated
  // (terminated(), or waitid() reported it), its zombie keeps the group id from being
  // reused, so this kills only what the rank left behind.
  ExitStatus reap();

 private:
  // Forks; the child runs the common set-up, then `child`, which never returns and reports
  // a failure to start as an errno on the descriptor it is given. Throws OSError naming
  // `what` when the child reports one.
  void start(const std::function<void(int report_fd)>& child, const sigset_t& mask, int stdout_fd, int stderr_fd,
             const std::string& what);

  pid_t pid_ = -1;
};

}  // namespace dtr::launcher
