// RankProcess: fork/exec of a rank, and its clean-up.
#include "tools/launcher/rank_process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "collectives/file_descriptor.h"
#include "kernels/error.h"

namespace dtr::launcher {
namespace {

std::vector<char*> null_terminated(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// The child's side of fork(): only async-signal-safe calls until execve(). Any failure is
// reported to the parent as an errno through `report_fd` (close-on-exec, so a successful
// execve() closes it and the parent reads end-of-file).
[[noreturn]] void exec_child(pid_t parent, const char* path, char* const argv[], char* const envp[],
                             const sigset_t& mask, int stdout_fd, int stderr_fd, int report_fd) {
  ::setpgid(0, 0);
  // Ask for SIGKILL when the launcher dies; if it already died, nobody would deliver it.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
  const int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd < 0 || ::dup2(null_fd, STDIN_FILENO) < 0 || ::dup2(stdout_fd, STDOUT_FILENO) < 0 ||
      ::dup2(stderr_fd, STDERR_FILENO) < 0) {
    const int error = errno;
    (void)!::write(report_fd, &error, sizeof(error));
    ::_exit(127);
  }
  for (int number : {SIGPIPE, SIGINT, SIGTERM, SIGCHLD}) ::signal(number, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  ::execve(path, argv, envp);
  const int error = errno;
  (void)!::write(report_fd, &error, sizeof(error));
  ::_exit(127);
}

}  // namespace

RankProcess::RankProcess(const std::string& path, const std::vector<std::string>& argv,
                         const std::vector<std::string>& env, const sigset_t& mask, int stdout_fd,
                         int stderr_fd) {
  const std::vector<char*> argv_pointers = null_terminated(argv);
  const std::vector<char*> env_pointers = null_terminated(env);
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
    exec_child(parent, path.c_str(), argv_pointers.data(), env_pointers.data(), mask, stdout_fd,
               stderr_fd, report_write.get());
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
    throw OSError(error, "cannot start '" + path + "'");
  }
}

RankProcess::RankProcess(RankProcess&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}

RankProcess::~RankProcess() {
  if (!running()) return;
  signal_group(SIGKILL);
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void RankProcess::signal_group(int signal) const {
  if (running()) ::killpg(pid_, signal);
}

ExitStatus RankProcess::reap() {
  // The terminated child still holds its pid as a zombie, so its group id cannot have been
  // reused yet: this kills only what the rank itself left behind.
  signal_group(SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return ExitStatus::from_wait_status(status);
}

}  // namespace dtr::launcher
