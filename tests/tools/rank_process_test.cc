// RankProcess, both ways of starting a rank: exec'ing a program (dtrrun) and running a
// function in the forked child (the multi-rank test harness). Both get the same set-up:
// their own process group, the parent-death signal, stdin from /dev/null, stdout/stderr on
// the given descriptors, default signal actions; the child checks each and its exit code
// says which failed. launcher_test covers the exec'd ranks end to end through dtrrun.
#include "tools/launcher/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/file_descriptor.h"

namespace {

using dtr::FileDescriptor;
using dtr::launcher::ExitStatus;
using dtr::launcher::RankProcess;

sigset_t current_mask() {
  sigset_t mask;
  ::sigprocmask(SIG_BLOCK, nullptr, &mask);
  return mask;
}

// Waits (with a generous deadline) for the child to end, then reaps it.
ExitStatus wait_for(RankProcess& process) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!process.terminated() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(process.terminated());
  return process.reap();
}

std::pair<FileDescriptor, FileDescriptor> make_pipe() {
  int ends[2];
  REQUIRE(::pipe2(ends, O_CLOEXEC) == 0);
  return {FileDescriptor(ends[0]), FileDescriptor(ends[1])};
}

std::string read_all(int fd) {
  std::string text;
  char buffer[256];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<size_t>(n));
  return text;
}

void on_usr1(int) {}

// The set-up a rank must find, as bits of its exit code (0: all as it should be).
int check_rank_set_up() {
  int wrong = 0;
  if (::getpgid(0) != ::getpid()) wrong |= 1;  // a process group of its own
  int death_signal = 0;
  if (::prctl(PR_GET_PDEATHSIG, &death_signal) != 0 || death_signal != SIGKILL) wrong |= 2;
  struct stat in {
  }, null{};
  if (::fstat(STDIN_FILENO, &in) != 0 || ::stat("/dev/null", &null) != 0 || in.st_rdev != null.st_rdev) wrong |= 4;
  struct sigaction usr1 {};
  if (::sigaction(SIGUSR1, nullptr, &usr1) != 0 || usr1.sa_handler != SIG_DFL) wrong |= 8;  // the parent's handler
  struct sigaction pipe {};
  if (::sigaction(SIGPIPE, nullptr, &pipe) != 0 || pipe.sa_handler != SIG_DFL) wrong |= 16;  // ignored in the parent
  return wrong;
}

// Installs a SIGUSR1 handler and ignores SIGPIPE for one scope, as a test binary or the
// launcher might; a rank must start with neither.
class ParentDispositions {
 public:
  ParentDispositions() {
    struct sigaction handler {};
    handler.sa_handler = on_usr1;
    ::sigaction(SIGUSR1, &handler, &usr1_);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &pipe_);
  }
  ~ParentDispositions() {
    ::sigaction(SIGUSR1, &usr1_, nullptr);
    ::sigaction(SIGPIPE, &pipe_, nullptr);
  }

 private:
  struct sigaction usr1_ {
  }, pipe_{};
};

TEST_CASE("RankProcess with a function: the rank's set-up, its output and its exit code") {
  ParentDispositions dispositions;
  auto [out_read, out_write] = make_pipe();
  RankProcess rank(
      [] {
        std::printf("hello from the rank\n");
        return check_rank_set_up() + 100;
      },
      current_mask(), out_write.get(), STDERR_FILENO);
  out_write.reset();
  CHECK(rank.running());
  CHECK(read_all(out_read.get()) == "hello from the rank\n");
  const ExitStatus status = wait_for(rank);
  CHECK_FALSE(rank.running());
  CHECK(status.signal == 0);
  CHECK(status.code == 100);  // 100 + no wrong bits
}

TEST_CASE("RankProcess with a program: the same set-up as a function") {
  ParentDispositions dispositions;
  // The shell prints: read's status (1: end of file at once, stdin is /dev/null), its
  // process group and pid (from /proc), and its mask of ignored signals (SigIgn, in hex).
  auto [out_read, out_write] = make_pipe();
  RankProcess rank("/bin/sh",
                   {"sh", "-c",
                    "read -r line; r=$?; set -- $(cut -d' ' -f5 /proc/$$/stat); "
                    "echo \"$r $1 $$ $(grep SigIgn /proc/$$/status | cut -f2)\"; exit 7"},
                   {"PATH=/bin:/usr/bin"}, current_mask(), out_write.get(), STDERR_FILENO);
  out_write.reset();
  const pid_t pid = rank.pid();
  std::istringstream out(read_all(out_read.get()));
  const ExitStatus status = wait_for(rank);
  int read_status = -1;
  pid_t group = 0, shell = 0;
  std::string ignored;
  out >> read_status >> group >> shell >> ignored;
  CHECK(status.signal == 0);
  CHECK(status.code == 7);
  CHECK(read_status == 1);
  CHECK(shell == pid);
  CHECK(group == pid);
  INFO("SigIgn " << ignored);
  CHECK((std::stoull(ignored, nullptr, 16) & (1ull << (SIGPIPE - 1))) == 0);
}

TEST_CASE("RankProcess: an exception escaping the function ends the rank with 1 and a line on its stderr") {
  auto [err_read, err_write] = make_pipe();
  RankProcess rank([]() -> int { throw std::runtime_error("boom in the rank"); }, current_mask(), STDOUT_FILENO,
                   err_write.get());
  err_write.reset();
  CHECK_THAT(read_all(err_read.get()), Catch::Contains("uncaught exception: boom in the rank"));
  const ExitStatus status = wait_for(rank);
  CHECK(status.code == 1);
}

TEST_CASE("RankProcess: terminated() reports the end without reaping; reap() kills a running rank's group") {
  RankProcess quick([] { return 0; }, current_mask(), STDOUT_FILENO, STDERR_FILENO);
  const ExitStatus done = wait_for(quick);
  CHECK(done.success());

  RankProcess sleeper(
      [] {
        ::pause();
        return 0;
      },
      current_mask(), STDOUT_FILENO, STDERR_FILENO);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(sleeper.terminated());
  CHECK(sleeper.running());
  const pid_t pid = sleeper.pid();
  const ExitStatus killed = sleeper.reap();
  CHECK(killed.signal == SIGKILL);
  CHECK_FALSE(sleeper.running());
  CHECK(::kill(pid, 0) != 0);  // gone, reaped
}

TEST_CASE("RankProcess: a program that cannot start is an OSError naming it and the system's reason") {
  try {
    RankProcess rank("/nonexistent/program", {"program"}, {}, current_mask(), STDOUT_FILENO, STDERR_FILENO);
    FAIL("a missing program started");
  } catch (const dtr::OSError& e) {
    CHECK(e.error_number() == ENOENT);
    CHECK_THAT(e.what(), Catch::Equals("cannot start '/nonexistent/program': No such file or directory"));
  }
}

}  // namespace
