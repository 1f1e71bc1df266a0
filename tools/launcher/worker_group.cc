// WorkerGroup: starting the ranks, relaying their output, stopping them.
#include "tools/launcher/worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string_view>

#include "core/error.h"
#include "tools/launcher/launcher_log.h"

extern char** environ;

namespace dtr::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// The launcher's environment with torchrun's variables for one rank set (replacing any
// inherited values of the same names).
std::vector<std::string> rank_environment(const LaunchConfig& config, int local_rank, int restart_count) {
  const std::vector<std::pair<std::string_view, std::string>> set = {
      {"RANK", std::to_string(config.global_rank(local_rank))},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"GROUP_RANK", std::to_string(config.node_rank)},
      {"WORLD_SIZE", std::to_string(config.world_size())},
      {"LOCAL_WORLD_SIZE", std::to_string(config.nproc_per_node)},
      {"MASTER_ADDR", config.master_addr},
      {"MASTER_PORT", std::to_string(config.master_port)},
      {"DTR_RESTART_COUNT", std::to_string(restart_count)},
      {"DTR_RUN_ID", config.run_id},
  };
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view variable = *entry;
    const std::string_view name = variable.substr(0, variable.find('='));
    const bool replaced = std::any_of(set.begin(), set.end(), [&](const auto& pair) { return pair.first == name; });
    if (!replaced) env.emplace_back(variable);
  }
  for (const auto& [name, value] : set) env.push_back(fmt::format("{}={}", name, value));
  return env;
}

std::pair<FileDescriptor, FileDescriptor> make_pipe() {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) {
    const int error = errno;
    throw OSError(error, "pipe2()");
  }
  return {FileDescriptor(ends[0]), FileDescriptor(ends[1])};
}

// Writes all of `text` to `fd`. Output that cannot be written (the reader of the launcher's
// stdout went away) is dropped: the ranks' pipes must keep draining either way.
void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<std::chrono::milliseconds::rep>(left.count(), 0, 1 << 30));
}

}  // namespace

std::string RankFailure::describe() const {
  return fmt::format("rank {} (local rank {}, pid {}) {}", rank, local_rank, pid, status.describe());
}

WorkerGroup::WorkerGroup(const LaunchConfig& config, const std::string& program_path, int restart_count,
                         LauncherSignals& signals)
    : signals_(signals),
      kill_grace_(
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config.kill_grace_seconds))) {
  workers_.reserve(config.nproc_per_node);
  streams_.reserve(2 * config.nproc_per_node);
  for (int local_rank = 0; local_rank < config.nproc_per_node; ++local_rank) {
    const int rank = config.global_rank(local_rank);
    auto [out_read, out_write] = make_pipe();
    auto [err_read, err_write] = make_pipe();
    workers_.push_back({rank, local_rank,
                        RankProcess(program_path, config.command, rank_environment(config, local_rank, restart_count),
                                    signals.child_mask(), out_write.get(), err_write.get())});
    const std::string prefix = fmt::format("[rank{}]: ", rank);
    streams_.push_back({std::move(out_read), LinePrefixer(prefix), STDOUT_FILENO});
    streams_.push_back({std::move(err_read), LinePrefixer(prefix), STDERR_FILENO});
  }
}

GroupOutcome WorkerGroup::wait() {
  GroupOutcome outcome;
  std::optional<Clock::time_point> drain_deadline;
  std::vector<pollfd> polled;
  std::vector<OutputStream*> polled_streams;
  while (true) {
    if (running_count() == 0) {
      // Something a rank started outside its process group may still hold a pipe open:
      // relay what comes within the grace period, then stop listening.
      if (!drain_deadline) drain_deadline = Clock::now() + kill_grace_;
      const bool open =
          std::any_of(streams_.begin(), streams_.end(), [](const OutputStream& s) { return s.pipe.valid(); });
      if (!open || outcome.interrupt_signal != 0 || Clock::now() >= *drain_deadline) break;
    }
    if (stopping_ && !killed_ && Clock::now() >= kill_deadline_) {
      launcher_log("{} rank(s) still running {} s after the stop signal; sending SIGKILL", running_count(),
                   std::chrono::duration<double>(kill_grace_).count());
      kill_running();
    }

    polled.assign(1, pollfd{.fd = signals_.fd(), .events = POLLIN, .revents = 0});
    polled_streams.clear();
    for (OutputStream& stream : streams_) {
      if (!stream.pipe.valid()) continue;
      polled.push_back({.fd = stream.pipe.get(), .events = POLLIN, .revents = 0});
      polled_streams.push_back(&stream);
    }
    int timeout_ms = -1;
    if (drain_deadline) {
      timeout_ms = milliseconds_until(*drain_deadline);
    } else if (stopping_ && !killed_) {
      timeout_ms = milliseconds_until(kill_deadline_);
    }
    if (::poll(polled.data(), polled.size(), timeout_ms) < 0) {
      const int error = errno;
      if (error == EINTR) continue;
      throw OSError(error, "poll()");
    }
    // Output first: a rank's last lines are relayed before the launcher reports its exit.
    for (size_t i = 1; i < polled.size(); ++i) {
      if (polled[i].revents != 0) relay(*polled_streams[i - 1]);
    }
    if (polled[0].revents != 0) {
      while (const int signal = signals_.next()) handle_signal(signal, outcome);
    }
  }
  for (OutputStream& stream : streams_) {
    if (!stream.pipe.valid()) continue;
    write_all(stream.destination, stream.prefixer.finish());
    stream.pipe.reset();
  }
  return outcome;
}

void WorkerGroup::handle_signal(int signal, GroupOutcome& outcome) {
  if (signal == SIGCHLD) {
    reap_exited(outcome);
  } else if (stopping_) {
    launcher_log("received {} while stopping; sending SIGKILL to {} rank(s)", signal_name(signal), running_count());
    kill_running();
  } else {
    outcome.interrupt_signal = signal;
    launcher_log("received {}; forwarding it to {} rank(s)", signal_name(signal), running_count());
    stop(signal);
  }
}

void WorkerGroup::reap_exited(GroupOutcome& outcome) {
  // Every rank that has exited by now is reaped before one failure is reported. Of failures
  // found together, one killed by a signal is the one reported: the others most likely
  // failed because it died (a peer's connection reset), and waitid returns zombies in no
  // particular order.
  std::optional<RankFailure> failure;
  while (true) {
    siginfo_t info{};
    // WNOWAIT: the exited rank stays a zombie, keeping its process group id from being reused
    // until reap() has killed what the rank left in that group.
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) break;
    const auto worker =
        std::find_if(workers_.begin(), workers_.end(), [&](const Worker& w) { return w.process.pid() == info.si_pid; });
    if (worker == workers_.end()) {
      // Not a rank: a child that the process which exec'd dtrrun had started. Collect it.
      ::waitpid(info.si_pid, nullptr, 0);
      continue;
    }
    const pid_t pid = worker->process.pid();
    const ExitStatus status = worker->process.reap();
    if (status.success()) continue;
    if (stopping_) {
      // Killed by a signal dtrrun did not send, while the others were being stopped for a
      // rank's exit code: it most likely died first (its peers saw its connections close
      // before the kernel made it a zombie), so it is the failure to report.
      const bool not_sent =
          status.signal != 0 && status.signal != stop_signal_ && !(killed_ && status.signal == SIGKILL);
      if (outcome.failure && outcome.failure->status.signal == 0 && not_sent) {
        outcome.failure = RankFailure{worker->rank, worker->local_rank, pid, status};
        launcher_log("{} (not by dtrrun): the first failure", outcome.failure->describe());
      }
      continue;
    }
    if (!failure || (failure->status.signal == 0 && status.signal != 0)) {
      failure = RankFailure{worker->rank, worker->local_rank, pid, status};
    }
  }
  if (!failure) return;
  outcome.failure = failure;
  launcher_log("{}; stopping the other {} rank(s)", outcome.failure->describe(), running_count());
  stop(SIGTERM);
}

void WorkerGroup::relay(OutputStream& stream) {
  char buffer[64 * 1024];
  ssize_t n;
  do {
    n = ::read(stream.pipe.get(), buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    write_all(stream.destination, stream.prefixer.feed(std::string_view(buffer, n)));
    return;
  }
  // End of file (the rank and everything it started closed the pipe), or a broken pipe.
  write_all(stream.destination, stream.prefixer.finish());
  stream.pipe.reset();
}

void WorkerGroup::stop(int signal) {
  stopping_ = true;
  stop_signal_ = signal;
  kill_deadline_ = Clock::now() + kill_grace_;
  for (const Worker& worker : workers_) worker.process.signal_group(signal);
}

void WorkerGroup::kill_running() {
  killed_ = true;
  for (const Worker& worker : workers_) worker.process.signal_group(SIGKILL);
}

int WorkerGroup::running_count() const {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.process.running(); }));
}

}  // namespace dtr::launcher
