// launch_self: a WorkerGroup over this program's own binary.
#include "tools/launcher/self_launch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "core/error.h"
#include "tools/launcher/exit_status.h"
#include "tools/launcher/free_port.h"
#include "tools/launcher/launch_config.h"
#include "tools/launcher/launcher_signals.h"
#include "tools/launcher/worker_group.h"

namespace dtr::launcher {
namespace {

// The path of the running binary: the ranks exec the same file, wherever Bazel put it.
std::string own_binary() {
  std::string path(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
  if (n < 0) {
    const int error = errno;
    throw OSError(error, "readlink(/proc/self/exe)");
  }
  path.resize(static_cast<size_t>(n));
  return path;
}

}  // namespace

bool is_rank_process() { return std::getenv("RANK") != nullptr && std::getenv("WORLD_SIZE") != nullptr; }

SelfLaunchResult launch_self(int nproc, std::span<char* const> argv) {
  LaunchConfig config;
  config.nproc_per_node = nproc;
  config.master_port = find_free_port(config.master_addr);
  config.run_id = fmt::format("self-{}", ::getpid());
  config.command.assign(argv.begin(), argv.end());
  LauncherSignals signals;
  const GroupOutcome outcome = WorkerGroup(config, own_binary(), 0, signals).wait();
  if (outcome.interrupt_signal != 0) {
    return {128 + outcome.interrupt_signal, fmt::format("stopped by {}", signal_name(outcome.interrupt_signal))};
  }
  if (outcome.failure) return {outcome.failure->status.shell_code(), outcome.failure->describe()};
  return {};
}

}  // namespace dtr::launcher
