// LaunchConfig: dtrrun's flags (CLI11) and their validation.
#include "tools/launcher/launch_config.h"

#include <fmt/format.h>

namespace dtr::launcher {
namespace {

constexpr double kMaxKillGraceSeconds = 3600;
constexpr int kMaxRanksPerNode = 1024;

}  // namespace

LaunchConfig parse_launch_config(CLI::App& app, int argc, const char* const* argv) {
  LaunchConfig config;
  app.add_option("--nproc-per-node,--nproc_per_node", config.nproc_per_node, "Ranks to start on this node")
      ->capture_default_str();
  app.add_option("--nnodes", config.nnodes, "Nodes in the job")->capture_default_str();
  app.add_option("--node-rank,--node_rank", config.node_rank, "This node's index, 0 .. nnodes-1")
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", config.master_addr,
                 "Address of rank 0's node, passed to ranks as MASTER_ADDR")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", config.master_port,
                 "Port passed to ranks as MASTER_PORT; a free one is picked on a single node "
                 "when it is not given");
  app.add_option("--max-restarts,--max_restarts", config.max_restarts,
                 "Times the local group is restarted after a rank fails")
      ->capture_default_str();
  app.add_option("--kill-grace-seconds,--kill_grace_seconds", config.kill_grace_seconds,
                 "Seconds between SIGTERM and SIGKILL when ranks are stopped")
      ->capture_default_str();
  app.add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", config.run_id,
                 "Job id passed to ranks as DTR_RUN_ID (default: a fresh one per launch; "
                 "give every node the same one)");
  app.prefix_command();
  app.footer(
      "The program and its arguments follow the flags (\"--\" may separate them). Each rank "
      "gets RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, "
      "MASTER_PORT, DTR_RESTART_COUNT and DTR_RUN_ID; its output lines are prefixed "
      "\"[rank<RANK>]: \".");
  app.parse(argc, argv);

  config.command = app.remaining();
  if (!config.command.empty() && config.command.front() == "--") {
    config.command.erase(config.command.begin());
  } else if (!config.command.empty() && config.command.front().starts_with('-')) {
    throw CLI::ValidationError(fmt::format("unknown flag '{}' (put \"--\" before a program whose name starts with '-')",
                                           config.command.front()));
  }
  if (config.command.empty()) {
    throw CLI::ValidationError("no program to run");
  }
  // The upper bound keeps a typo from forking thousands of processes (each with its pipes)
  // before the node runs out of descriptors.
  if (config.nproc_per_node < 1 || config.nproc_per_node > kMaxRanksPerNode) {
    throw CLI::ValidationError(
        fmt::format("--nproc-per-node must be from 1 to {}, got {}", kMaxRanksPerNode, config.nproc_per_node));
  }
  if (config.nnodes < 1) {
    throw CLI::ValidationError(fmt::format("--nnodes must be at least 1, got {}", config.nnodes));
  }
  if (config.node_rank < 0 || config.node_rank >= config.nnodes) {
    throw CLI::ValidationError(fmt::format("--node-rank {} is out of range for --nnodes {} (0 .. {})", config.node_rank,
                                           config.nnodes, config.nnodes - 1));
  }
  if (config.master_port < 0 || config.master_port > 65535) {
    throw CLI::ValidationError(
        fmt::format("--master-port must be in 1 .. 65535 (or 0 to pick a free port on a "
                    "single node), got {}",
                    config.master_port));
  }
  if (config.nnodes > 1 && config.master_port == 0) {
    throw CLI::ValidationError(
        fmt::format("--master-port is required with --nnodes {}: every node must pass the same port (a "
                    "free port can only be picked for a single node)",
                    config.nnodes));
  }
  if (config.max_restarts < 0) {
    throw CLI::ValidationError(fmt::format("--max-restarts must be at least 0, got {}", config.max_restarts));
  }
  if (!(config.kill_grace_seconds >= 0 && config.kill_grace_seconds <= kMaxKillGraceSeconds)) {
    throw CLI::ValidationError(fmt::format("--kill-grace-seconds must be in 0 .. {}, got {}", kMaxKillGraceSeconds,
                                           config.kill_grace_seconds));
  }
  return config;
}

}  // namespace dtr::launcher
