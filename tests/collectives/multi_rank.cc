#include "tests/collectives/multi_rank.h"

#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "collectives/init.h"
#include "collectives/tcp_store.h"

namespace dtr::testing {
namespace {

using Clock = std::chrono::steady_clock;

// In a rank process: the failures seen so far, sent to the parent at exit. Null in the parent.
std::string* g_rank_failures = nullptr;

// Records every failed assertion of a rank process (the parent's own run is untouched).
class RankFailureListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  bool assertionEnded(const Catch::AssertionStats& stats) override {
    const Catch::AssertionResult& r = stats.assertionResult;
    if (g_rank_failures == nullptr || r.isOk()) return true;
    std::string s = fmt::format("\n  {}:{}: {}", r.getSourceInfo().file, r.getSourceInfo().line,
                                r.hasExpression() ? r.getExpressionInMacro() : std::string("FAIL"));
    if (r.hasExpandedExpression() && r.getExpandedExpression() != r.getExpression()) {
      s += " with expansion " + r.getExpandedExpression();
    }
    if (r.hasMessage()) s += " -- " + r.getMessage();
    for (const Catch::MessageInfo& m : stats.infoMessages) s += "\n    with " + m.message;
    *g_rank_failures += s;
    return true;
  }
};
CATCH_REGISTER_LISTENER(RankFailureListener)

[[noreturn]] void run_child(int rank, int world, uint16_t port, int report_fd,
                            const std::function<void(int, int)>& body, const RanksOptions& options) {
  // A crashing rank dies by its signal, silently: Catch's fatal-signal handler would print a
  // test-run summary from the child, which log readers would count as the parent's.
  for (int sig : {SIGABRT, SIGSEGV, SIGILL, SIGFPE, SIGBUS, SIGTERM}) ::signal(sig, SIG_DFL);
  std::string failures;
  g_rank_failures = &failures;
  const std::string r = std::to_string(rank), w = std::to_string(world), p = std::to_string(port);
  setenv("RANK", r.c_str(), 1);
  setenv("LOCAL_RANK", r.c_str(), 1);
  setenv("WORLD_SIZE", w.c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", w.c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", p.c_str(), 1);
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  set_default_timeout(options.group_timeout);
  try {
    body(rank, world);
  } catch (const std::exception& e) {
    failures += fmt::format("\n  uncaught exception: {}", e.what());
  } catch (...) {
    if (failures.empty()) failures += "\n  uncaught non-standard exception";  // else a failed REQUIRE, recorded
  }
  try {
    destroy_process_group();
  } catch (const std::exception& e) {
    failures += fmt::format("\n  destroy_process_group: {}", e.what());
  }
  std::cout.flush();
  std::fflush(nullptr);
  size_t off = 0;
  while (off < failures.size()) {
    const ssize_t n = ::write(report_fd, failures.data() + off, failures.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  ::_exit(failures.empty() ? 0 : 1);  // no static destructors: they belong to the parent
}

}  // namespace

std::vector<RankOutcome> run_ranks_outcomes(int world, const std::function<void(int, int)>& body,
                                            const RanksOptions& options) {
  TCPStoreServer server("127.0.0.1", 0);
  struct Child {
    pid_t pid = -1;
    int fd = -1;
    std::string report;
    bool running = true;
    int status = 0;
  };
  std::vector<Child> children(world);
  std::cout.flush();
  std::fflush(nullptr);
  for (int rank = 0; rank < world; ++rank) {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      run_child(rank, world, server.port(), fds[1], body, options);
    }
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    children[rank].pid = pid;
    children[rank].fd = fds[0];
  }
  const auto deadline = Clock::now() + options.deadline;
  auto drain = [](Child& c) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(c.fd, buf, sizeof buf)) > 0) c.report.append(buf, static_cast<size_t>(n));
  };
  while (std::any_of(children.begin(), children.end(), [](const Child& c) { return c.running; })) {
    std::vector<pollfd> fds;
    for (const Child& c : children) fds.push_back({c.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 20);
    for (Child& c : children) {
      drain(c);
      if (c.running && ::waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.running = false;
    }
    if (Clock::now() > deadline) {
      for (Child& c : children) {
        if (!c.running) continue;
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &c.status, 0);
        c.running = false;
        c.report += fmt::format("\n  still running after the harness deadline of {} s: killed (a hang?)",
                                options.deadline.count());
        c.status = -1;
      }
    }
  }
  std::vector<RankOutcome> outcomes;
  for (int rank = 0; rank < world; ++rank) {
    Child& c = children[rank];
    drain(c);
    ::close(c.fd);
    RankOutcome o{rank, false, c.report};
    const bool may_die = std::find(options.may_die.begin(), options.may_die.end(), rank) != options.may_die.end();
    if (c.status == -1) {
      o.ok = false;
    } else if (WIFEXITED(c.status)) {
      o.ok = WEXITSTATUS(c.status) == 0 && c.report.empty();
      if (!o.ok && o.report.empty()) o.report = fmt::format("\n  exited with status {}", WEXITSTATUS(c.status));
    } else if (WIFSIGNALED(c.status)) {
      o.ok = may_die;
      if (!may_die)
        o.report += fmt::format("\n  killed by signal {} ({})", WTERMSIG(c.status), strsignal(WTERMSIG(c.status)));
    }
    outcomes.push_back(std::move(o));
  }
  return outcomes;
}

void run_ranks(int world, const std::function<void(int, int)>& body, const RanksOptions& options) {
  for (const RankOutcome& o : run_ranks_outcomes(world, body, options)) {
    if (!o.ok) FAIL_CHECK(fmt::format("rank {} of {} failed:{}", o.rank, world, o.report));
  }
}

}  // namespace dtr::testing
