// ExitStatus: decoding wait statuses and naming signals.
#include "tools/launcher/exit_status.h"

#include <fmt/format.h>
#include <string.h>
#include <sys/wait.h>

namespace dtr::launcher {

ExitStatus ExitStatus::from_wait_status(int wait_status) {
  if (WIFSIGNALED(wait_status)) return {.code = 0, .signal = WTERMSIG(wait_status)};
  return {.code = WEXITSTATUS(wait_status), .signal = 0};
}

std::string ExitStatus::describe() const {
  if (signal != 0) return fmt::format("was killed by signal {} ({})", signal, signal_name(signal));
  return fmt::format("exited with code {}", code);
}

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);  // "TERM" for SIGTERM (glibc >= 2.32)
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", signal);
}

}  // namespace dtr::launcher
