// parse_launch_config: torchrun's flags in both spellings, the program's own arguments
// left alone, and each mistake rejected with a message that names the flag.
#include "tools/launcher/launch_config.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using dtr::launcher::LaunchConfig;
using dtr::launcher::parse_launch_config;

namespace {

LaunchConfig parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dtrrun");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  CLI::App app;
  return parse_launch_config(app, static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("parse_launch_config defaults to one rank on one node") {
  const LaunchConfig config = parse({"train"});
  CHECK(config.nproc_per_node == 1);
  CHECK(config.nnodes == 1);
  CHECK(config.node_rank == 0);
  CHECK(config.master_addr == "127.0.0.1");
  CHECK(config.master_port == 0);
  CHECK(config.max_restarts == 0);
  CHECK(config.kill_grace_seconds == 5.0);
  CHECK(config.run_id.empty());
  CHECK(config.command == std::vector<std::string>{"train"});
  CHECK(config.world_size() == 1);
}

TEST_CASE("parse_launch_config accepts torchrun's dash, underscore and '=' spellings") {
  const std::vector<std::vector<std::string>> spellings = {
      {"--nproc-per-node", "4", "--nnodes", "3", "--node-rank", "2", "--master-addr", "10.0.0.1", "--master-port",
       "29500", "--max-restarts", "2", "--kill-grace-seconds", "1.5", "--run-id", "job"},
      {"--nproc_per_node", "4", "--nnodes", "3", "--node_rank", "2", "--master_addr", "10.0.0.1", "--master_port",
       "29500", "--max_restarts", "2", "--kill_grace_seconds", "1.5", "--rdzv_id", "job"},
      {"--nproc-per-node=4", "--nnodes=3", "--node_rank=2", "--master-addr=10.0.0.1", "--master_port=29500",
       "--max-restarts=2", "--kill-grace-seconds=1.5", "--rdzv-id=job"},
  };
  for (std::vector<std::string> args : spellings) {
    args.insert(args.end(), {"train", "--steps", "10"});
    const LaunchConfig config = parse(args);
    CHECK(config.nproc_per_node == 4);
    CHECK(config.nnodes == 3);
    CHECK(config.node_rank == 2);
    CHECK(config.master_addr == "10.0.0.1");
    CHECK(config.master_port == 29500);
    CHECK(config.max_restarts == 2);
    CHECK(config.kill_grace_seconds == 1.5);
    CHECK(config.run_id == "job");
    CHECK(config.command == std::vector<std::string>{"train", "--steps", "10"});
    CHECK(config.world_size() == 12);
    CHECK(config.global_rank(0) == 8);
    CHECK(config.global_rank(3) == 11);
  }
}

TEST_CASE("parse_launch_config stops at the program") {
  CHECK(parse({"--nproc-per-node", "2", "train", "--nproc-per-node", "5", "-x"}).command ==
        std::vector<std::string>{"train", "--nproc-per-node", "5", "-x"});
  CHECK(parse({"--nproc-per-node", "2", "train", "--nproc-per-node", "5"}).nproc_per_node == 2);
  CHECK(parse({"--", "train", "--", "x"}).command == std::vector<std::string>{"train", "--", "x"});
  CHECK(parse({"--", "-weird-name"}).command == std::vector<std::string>{"-weird-name"});
}

TEST_CASE("parse_launch_config rejects mistakes, naming the flag and what is legal") {
  using Catch::Contains;
  CHECK_THROWS_WITH(parse({}), Contains("no program to run"));
  CHECK_THROWS_WITH(parse({"--nproc-per-node", "3"}), Contains("no program to run"));
  CHECK_THROWS_WITH(parse({"--nproc-per-node", "0", "train"}),
                    Contains("--nproc-per-node must be from 1 to 1024, got 0"));
  CHECK_THROWS_WITH(parse({"--nproc-per-node", "100000", "train"}),
                    Contains("--nproc-per-node must be from 1 to 1024, got 100000"));
  CHECK_THROWS_WITH(parse({"--nnodes", "-1", "train"}), Contains("--nnodes must be at least 1, got -1"));
  CHECK_THROWS_WITH(parse({"--nnodes", "2", "--node-rank", "-1", "--master-port", "1", "train"}),
                    Contains("--node-rank -1 is out of range for --nnodes 2 (0 .. 1)"));
  CHECK_THROWS_WITH(parse({"--nnodes", "4", "train"}), Contains("--master-port is required with --nnodes 4"));
  CHECK_THROWS_WITH(parse({"--master-port", "65536", "train"}), Contains("--master-port must be in 1 .. 65535"));
  CHECK_THROWS_WITH(parse({"--max-restarts", "-2", "train"}), Contains("--max-restarts must be at least 0, got -2"));
  CHECK_THROWS_WITH(parse({"--kill-grace-seconds", "4000", "train"}),
                    Contains("--kill-grace-seconds must be in 0 .. 3600, got 4000"));
  CHECK_THROWS_WITH(parse({"--nproc-per-node", "four", "train"}), Contains("--nproc-per-node"));
  CHECK_THROWS_WITH(parse({"--unknown", "train"}), Contains("unknown flag '--unknown'"));
  CHECK_THROWS_AS(parse({"--help"}), CLI::CallForHelp);
}
