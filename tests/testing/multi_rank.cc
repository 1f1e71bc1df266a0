#include "tests/testing/multi_rank.h"

#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "collectives/init.h"
#include "collectives/tcp_store.h"
#include "core/file_descriptor.h"
#include "tools/launcher/rank_process.h"

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

// A rank process's main: runs the body with torchrun's environment and writes what failed
// to `report_fd`. RankProcess has given it its own process group, the parent-death signal
// and default signal actions (so a crash ends it by its signal, silently: Catch's
// fatal-signal handler would print a test-run summary that log readers would count as the
// parent's). It ends through _exit(): no static destructors, they belong to the parent.
int run_child(int rank, int world, uint16_t port, int report_fd, const std::function<void(int, int)>& body,
              const RanksOptions& options) {
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
  size_t off = 0;
  while (off < failures.size()) {
    const ssize_t n = ::write(report_fd, failures.data() + off, failures.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  return failures.empty() ? 0 : 1;
}

// One rank as the parent sees it: its process, the pipe its failures come through, and how it ended.
struct Child {
  std::optional<launcher::RankProcess> process;
  FileDescriptor report_pipe;
  std::string report;
  std::optional<launcher::ExitStatus> status;  // once reaped; none for a rank killed as hung
  bool hung = false;

  // Reads what the rank has written so far (the pipe is non-blocking).
  void drain() {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(report_pipe.get(), buf, sizeof buf)) > 0) report.append(buf, static_cast<size_t>(n));
  }
};

}  // namespace

std::vector<RankOutcome> run_ranks_outcomes(int world, const std::function<void(int, int)>& body,
                                            const RanksOptions& options) {
  TCPStoreServer server("127.0.0.1", 0);
  sigset_t mask;
  ::sigprocmask(SIG_SETMASK, nullptr, &mask);
  std::vector<Child> children(world);
  std::cout.flush();
  for (int rank = 0; rank < world; ++rank) {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    children[rank].report_pipe = FileDescriptor(fds[0]);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);       // the parent's end only: a rank's report is never cut short
    const FileDescriptor report_write(fds[1]);  // the child's end; closed here once it has it
    children[rank].process.emplace(
        [&, rank] { return run_child(rank, world, server.port(), report_write.get(), body, options); }, mask,
        STDOUT_FILENO, STDERR_FILENO);
  }
  // Every rank runs to its end or the deadline, whatever the others do: a failure test
  // reads what the surviving ranks report.
  const auto deadline = Clock::now() + options.deadline;
  auto running = [&] {
    return std::any_of(children.begin(), children.end(), [](const Child& c) { return c.process->running(); });
  };
  while (running()) {
    std::vector<pollfd> fds;
    for (const Child& c : children) fds.push_back({c.report_pipe.get(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), 20);
    for (Child& c : children) {
      c.drain();
      if (c.process->running() && c.process->terminated()) c.status = c.process->reap();
    }
    if (Clock::now() > deadline) {
      for (Child& c : children) {
        if (!c.process->running()) continue;
        c.process->reap();  // kills it first
        c.hung = true;
        c.report += fmt::format("\n  still running after the harness deadline of {} s: killed (a hang?)",
                                options.deadline.count());
      }
    }
  }
  std::vector<RankOutcome> outcomes;
  for (int rank = 0; rank < world; ++rank) {
    Child& c = children[rank];
    c.drain();
    RankOutcome o{rank, false, c.report};
    const bool may_die = std::find(options.may_die.begin(), options.may_die.end(), rank) != options.may_die.end();
    if (c.hung) {
      o.ok = false;
    } else if (c.status->signal == 0) {
      o.ok = c.status->code == 0 && c.report.empty();
      if (!o.ok && o.report.empty()) o.report = "\n  " + c.status->describe();
    } else {
      o.ok = may_die;
      if (!may_die) o.report += "\n  " + c.status->describe();
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
