// RankProcess: fork, the child's set-up, exec or a function, and the clean-up.
#include "tools/launcher/rank_process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <exception>
#include <utility>

#include "core/error.h"
#include "core/file_descriptor.h"

namespace dtr::launcher {
namespace {

std::vector<char*> null_terminated(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// Reports `error` to the parent through `report_fd` and ends the child.
[[noreturn]] void report_and_exit(int report_fd, int error) {
  (void)!::write(report_fd, &error, sizeof(error));
  ::_exit(127);
}

// The child's side of fork(), before it execs or runs its function: only async-signal-safe
// calls. Returns 0, or the errno of the call that failed.
int set_up_child(pid_t parent, const sigset_t& mask, int stdout_fd, int stderr_fd) {
  ::setpgid(0, 0);
  // Ask for SIGKILL when the launcher dies; if it already died, nobody would deliver it.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0 || ::dup2(null_fd, STDIN_FILENO) < 0 || ::dup2(stdout_fd, STDOUT_FILENO) < 0 ||
      ::dup2(stderr_fd, STDERR_FILENO) < 0) {
    return errno;
  }
  if (null_fd != STDIN_FILENO) ::close(null_fd);
  // A handler the parent installed would run the parent's code in the rank: exec resets it to
  // the default action, and so does this, for a child that runs a function instead.
  for (int number = 1; number < NSIG; ++number) {
    struct sigaction action {};
    if (::sigaction(number, nullptr, &action) != 0) continue;
    if (action.sa_handler != SIG_DFL && action.sa_handler != SIG_IGN) ::signal(number, SIG_DFL);
  }
  // Ignored ones survive exec: the launcher's own must not reach the rank.
  for (int number : {SIGPIPE, SIGINT, SIGTERM, SIGCHLD}) ::signal(number, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  return 0;
}

}  // namespace

RankProcess::RankProcess(const std::string& path, const std::vector<std::string>& argv,
                         const std::vector<std::string>& env, const sigset_t& mask, int stdout_fd, int stderr_fd) {
  const std::vector<char*> argv_pointers = null_terminated(argv);
  const std::vector<char*> env_pointers = null_terminated(env);
  start(
      [&](int report_fd) {
        // The report descriptor is close-on-exec: a successful execve() closes it.
        ::execve(path.c_str(), argv_pointers.data(), env_pointers.data());
        report_and_exit(report_fd, errno);
      },
      mask, stdout_fd, stderr_fd, "cannot start '" + path + "'");
}

RankProcess::RankProcess(const std::function<int()>& body, const sigset_t& mask, int stdout_fd, int stderr_fd) {
  std::fflush(nullptr);
  start(
      [&](int report_fd) {
        ::close(report_fd);  // set up: the parent reads end-of-file
        int code = 1;
        // The child's main: nothing it throws may unwind into the parent's frames.
        try {
          code = body();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank process %d: uncaught exception: %s\n", ::getpid(), e.what());
        } catch (...) {
          std::fprintf(stderr, "rank process %d: uncaught exception\n", ::getpid());
        }
        std::fflush(nullptr);
        ::_exit(code);
      },
      mask, stdout_fd, stderr_fd, "cannot start a rank process");
}

void RankProcess::start(const std::function<void(int)>& child, const sigset_t& mask, int stdout_fd, int stderr_fd,
                        const std::string& what) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    const int error = errno;
    throw OSError(error, "pipe2()");
  }
  FileDescriptor report_read(report[0]);
  FileDescriptor report_write(report[1]);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    throw OSError(error, "fork()");
  }
  if (pid == 0) {
    report_read.reset();
    if (const int error = set_up_child(parent, mask, stdout_fd, stderr_fd); error != 0) {
      report_and_exit(report_write.get(), error);
    }
    child(report_write.get());
    ::_exit(127);  // not reached: `child` execs or exits
  }
  pid_ = pid;
  // Also set the group here, so that signal_group() works before the child runs.
  ::setpgid(pid, pid);
  report_write.reset();
  int error = 0;
  ssize_t n;
  do {
    n = ::read(report_read.get(), &error, sizeof(error));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(error))) {
    int status;
    ::waitpid(pid, &status, 0);
    pid_ = -1;
    throw OSError(error, what);
  }
}

RankProcess::RankProcess(RankProcess&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}

RankProcess::~RankProcess() {
  if (!running()) return;
  signal_group(SIGKILL);
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {}
}

bool RankProcess::terminated() const {
  if (!running()) return true;
  siginfo_t info{};
  // WNOWAIT: the child stays a zombie, so its process group id is not reused before reap().
  return ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_;
}

void RankProcess::signal_group(int signal) const {
  if (running()) ::killpg(pid_, signal);
}

ExitStatus RankProcess::reap() {
  // The terminated child still holds its pid as a zombie, so its group id cannot have been
  // reused yet: this kills only what the rank itself left behind.
  signal_group(SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {}
  pid_ = -1;
  return ExitStatus::from_wait_status(status);
}

}  // namespace dtr::launcher
