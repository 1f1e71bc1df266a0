// LauncherSignals: the launcher's signals (SIGCHLD, SIGINT, SIGTERM) as readable events.
//
// While one exists, those three signals are blocked for the process and delivered through
// a signalfd, so the launcher's single poll() loop sees a rank's exit, a Ctrl-C and a
// `kill` in order, with no handler code and no race between checking and sleeping.
// SIGPIPE is ignored (a closed stdout must not kill the launcher while ranks still run).
// Ranks must not inherit any of this: they start with child_mask() and default
// dispositions. The destructor restores the process's original mask and SIGPIPE action.
#pragma once

#include <signal.h>

#include "core/file_descriptor.h"

namespace dtr::launcher {

class LauncherSignals {
 public:
  LauncherSignals();
  ~LauncherSignals();
  LauncherSignals(const LauncherSignals&) = delete;
  LauncherSignals& operator=(const LauncherSignals&) = delete;

  // The descriptor to poll for POLLIN.
  int fd() const { return fd_.get(); }
  // Takes one pending signal's number, or returns 0 when none is pending.
  int next();
  // The signal mask the launcher started with, for its ranks to start with.
  const sigset_t& child_mask() const { return original_mask_; }

 private:
  sigset_t original_mask_{};
  struct sigaction original_sigpipe_ {};
  FileDescriptor fd_;
};

}  // namespace dtr::launcher
