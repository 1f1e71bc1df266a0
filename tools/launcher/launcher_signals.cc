// LauncherSignals: blocking SIGCHLD/SIGINT/SIGTERM and reading them from a signalfd.
#include "tools/launcher/launcher_signals.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.h"

namespace dtr::launcher {

LauncherSignals::LauncherSignals() {
  sigset_t handled;
  sigemptyset(&handled);
  sigaddset(&handled, SIGCHLD);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGTERM);
  if (::sigprocmask(SIG_BLOCK, &handled, &original_mask_) != 0) {
    const int error = errno;
    throw OSError(error, "sigprocmask()");
  }
  fd_ = FileDescriptor(::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!fd_.valid()) {
    const int error = errno;
    ::sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
    throw OSError(error, "signalfd()");
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &original_sigpipe_);
}

LauncherSignals::~LauncherSignals() {
  ::sigaction(SIGPIPE, &original_sigpipe_, nullptr);
  ::sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
}

int LauncherSignals::next() {
  signalfd_siginfo info{};
  while (true) {
    const ssize_t n = ::read(fd_.get(), &info, sizeof(info));
    if (n == static_cast<ssize_t>(sizeof(info))) return static_cast<int>(info.ssi_signo);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return 0;
    const int error = errno;
    throw OSError(error, "read() from signalfd");
  }
}

}  // namespace dtr::launcher
