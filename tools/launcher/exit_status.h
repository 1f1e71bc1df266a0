// ExitStatus: how a rank ended, as the launcher reports it and as its own exit code.
//
// Exactly one of `code` and `signal` is meaningful: a process either exited with a code
// (signal == 0) or was killed by a signal (signal > 0). The launcher's exit code follows
// the shell's rule: the code itself, or 128 + signal (so SIGKILL is 137).
// Messages read like torchrun's: "exited with code 3", "was killed by signal 9 (SIGKILL)".
#pragma once

#include <string>

namespace dtr::launcher {

struct ExitStatus {
  int code = 0;    // the exit code when signal == 0
  int signal = 0;  // the signal that killed the process, or 0

  // Decodes a status filled in by waitpid() for a process that terminated.
  static ExitStatus from_wait_status(int wait_status);

  bool success() const { return signal == 0 && code == 0; }
  // The shell's exit code for this status: code, or 128 + signal.
  int shell_code() const { return signal != 0 ? 128 + signal : code; }
  // "exited with code 3" or "was killed by signal 9 (SIGKILL)".
  std::string describe() const;
};

// The signal's name as C code spells it ("SIGTERM"), or "signal 77" for one without a name.
std::string signal_name(int signal);

}  // namespace dtr::launcher
