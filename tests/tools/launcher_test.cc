// dtrrun end to end: the real binary starts launcher_probe as ranks, and the tests check
// the ranks' environment, the prefixed output, failure handling, signals and restarts
// against what torchrun users expect. Nothing here asserts a time; every wait has a
// generous deadline (kDeadline) that only a hung launcher reaches.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/test_util.h"
#include "tools/launcher/free_port.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Runfiles paths (a test runs in its workspace's runfiles root).
const std::string kDtrrun = "tools/launcher/dtrrun";
const std::string kProbe = "tests/tools/launcher_probe";
const std::string kCollectiveProbe = "tests/tools/collective_probe";
// Only a launcher that hangs reaches it; the probes that must be stopped sleep far longer.
constexpr auto kDeadline = std::chrono::seconds(60);
const std::string kLongSleep = "600";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A dtrrun process started by a test, with its stdout and stderr going to files.
struct Launch {
  pid_t pid;
  fs::path out_path;
  fs::path err_path;
};

struct Finished {
  int exit_code;  // the shell's view: the code, or 128 + the signal that killed dtrrun
  std::string out;
  std::string err;
};

// Starts dtrrun with `args` in the test's environment, minus OMP_NUM_THREADS and plus an
// inherited RANK=99, which dtrrun must both take care of.
Launch start_dtrrun(const std::vector<std::string>& args, const fs::path& dir, const std::string& name) {
  Launch launch{0, dir / (name + ".out"), dir / (name + ".err")};
  std::vector<std::string> argv = {kDtrrun};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> env = {"RANK=99"};
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (!std::string_view(*entry).starts_with("OMP_NUM_THREADS=")) env.emplace_back(*entry);
  }
  std::vector<char*> argv_pointers, env_pointers;
  for (std::string& s : argv) argv_pointers.push_back(s.data());
  for (std::string& s : env) env_pointers.push_back(s.data());
  argv_pointers.push_back(nullptr);
  env_pointers.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, launch.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, launch.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  const int rc =
      ::posix_spawn(&launch.pid, kDtrrun.c_str(), &actions, nullptr, argv_pointers.data(), env_pointers.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  return launch;
}

// Waits for dtrrun to exit; after kDeadline it is killed and the test fails.
Finished finish(const Launch& launch) {
  const auto deadline = Clock::now() + kDeadline;
  int status = 0;
  while (::waitpid(launch.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(launch.pid, SIGKILL);
      ::waitpid(launch.pid, &status, 0);
      FAIL("dtrrun did not exit within the deadline; stderr:\n" << read_file(launch.err_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  return {code, read_file(launch.out_path), read_file(launch.err_path)};
}

Finished run_dtrrun(const std::vector<std::string>& args) {
  return finish(start_dtrrun(args, dtr::testing::make_temp_dir("launcher_test"), "dtrrun"));
}

// Waits until `path` exists (a probe's marker file); fails the test after kDeadline.
void wait_for_file(const fs::path& path) {
  const auto deadline = Clock::now() + kDeadline;
  while (!fs::exists(path)) {
    REQUIRE(Clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// One relayed line: the rank named by its "[rankK]: " prefix and the rest of the line.
struct RankLine {
  int rank;
  std::string text;
};

// Splits relayed output into lines, requiring the rank prefix on every one.
std::vector<RankLine> rank_lines(const std::string& output) {
  static const std::regex prefixed(R"(\[rank(\d+)\]: (.*))");
  std::vector<RankLine> result;
  for (const std::string& line : lines_of(output)) {
    std::smatch match;
    INFO("line: " << line);
    REQUIRE(std::regex_match(line, match, prefixed));
    result.push_back({std::stoi(match[1]), match[2]});
  }
  return result;
}

// The variables of the probe's "env ..." lines, one map per line, each also holding the
// prefix's rank as "prefix".
std::vector<std::map<std::string, std::string>> env_lines(const std::string& output) {
  std::vector<std::map<std::string, std::string>> result;
  for (const RankLine& line : rank_lines(output)) {
    if (!line.text.starts_with("env ")) continue;
    std::map<std::string, std::string> vars = {{"prefix", std::to_string(line.rank)}};
    std::istringstream words(line.text.substr(4));
    for (std::string word; words >> word;) {
      const size_t eq = word.find('=');
      vars[word.substr(0, eq)] = word.substr(eq + 1);
    }
    result.push_back(vars);
  }
  return result;
}

// The rank lines of dtrrun's stderr, requiring every other line to be one of its own
// "[dtrrun] " messages.
std::vector<RankLine> stderr_rank_lines(const std::string& err) {
  std::string relayed;
  for (const std::string& line : lines_of(err)) {
    if (!line.starts_with("[dtrrun] ")) relayed += line + "\n";
  }
  return rank_lines(relayed);
}

}  // namespace

TEST_CASE("dtrrun gives each rank torchrun's environment and prefixes its lines") {
  const int nproc = GENERATE(1, 2, 4);
  INFO("--nproc-per-node " << nproc);
  const Finished run = run_dtrrun(
      {"--nproc-per-node", std::to_string(nproc), kProbe, "env", "stderr", "to stderr", "partial", "no newline"});
  INFO("stderr:\n" << run.err);
  REQUIRE(run.exit_code == 0);

  const auto envs = env_lines(run.out);
  REQUIRE(envs.size() == static_cast<size_t>(nproc));
  std::multiset<std::string> ranks;
  for (const auto& env : envs) {
    ranks.insert(env.at("RANK"));
    CHECK(env.at("prefix") == env.at("RANK"));
    CHECK(env.at("LOCAL_RANK") == env.at("RANK"));
    CHECK(env.at("GROUP_RANK") == "0");
    CHECK(env.at("WORLD_SIZE") == std::to_string(nproc));
    CHECK(env.at("LOCAL_WORLD_SIZE") == std::to_string(nproc));
    CHECK(env.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(env.at("MASTER_PORT") == envs.front().at("MASTER_PORT"));
    CHECK(env.at("DTR_RESTART_COUNT") == "0");
    CHECK(env.at("DTR_RUN_ID") == envs.front().at("DTR_RUN_ID"));
    CHECK(env.at("DTR_RUN_ID").size() == 16);
    // torchrun's default: one OpenMP thread per rank when several share the node.
    CHECK(env.at("OMP_NUM_THREADS") == (nproc > 1 ? "1" : "<unset>"));
  }
  for (int rank = 0; rank < nproc; ++rank) CHECK(ranks.count(std::to_string(rank)) == 1);
  const int port = std::stoi(envs.front().at("MASTER_PORT"));
  CHECK(port > 0);
  CHECK(port <= 65535);

  // The unterminated last line is flushed, as a line, once per rank; stderr is relayed too.
  std::multiset<int> partial_ranks, stderr_ranks;
  for (const RankLine& line : rank_lines(run.out)) {
    if (line.text == "no newline") partial_ranks.insert(line.rank);
  }
  for (const RankLine& line : stderr_rank_lines(run.err)) {
    if (line.text == "to stderr") stderr_ranks.insert(line.rank);
  }
  for (int rank = 0; rank < nproc; ++rank) {
    CHECK(partial_ranks.count(rank) == 1);
    CHECK(stderr_ranks.count(rank) == 1);
  }
}

TEST_CASE("dtrrun never interleaves pieces of lines from different ranks") {
  // Each rank writes its line one byte at a time, so the ranks' bytes arrive interleaved.
  const Finished run = run_dtrrun({"--nproc-per-node", "4", kProbe, "pieces", "abcdefghijklmnop"});
  INFO("stderr:\n" << run.err);
  REQUIRE(run.exit_code == 0);
  const auto lines = rank_lines(run.out);
  REQUIRE(lines.size() == 4);
  std::set<int> ranks;
  for (const RankLine& line : lines) {
    CHECK(line.text == "abcdefghijklmnop from rank " + std::to_string(line.rank));
    ranks.insert(line.rank);
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
}

TEST_CASE("a failing rank stops the others and its exit code becomes dtrrun's") {
  // Ranks 0 and 2 would sleep for 10 minutes: finishing at all means they were stopped.
  const Finished run = run_dtrrun({"--nproc-per-node", "3", kProbe, "exit-if-rank", "1", "3", "sleep", kLongSleep});
  INFO("stderr:\n" << run.err);
  CHECK(run.exit_code == 3);
  CHECK_THAT(run.err, Catch::Contains("[dtrrun] rank 1 (local rank 1, pid "));
  CHECK_THAT(run.err, Catch::Contains(") exited with code 3; stopping the other 2 rank(s)"));
  CHECK_THAT(run.err, Catch::Contains("[dtrrun] failed after 1 attempt(s): rank 1 (local rank 1"));
  CHECK(stderr_rank_lines(run.err).empty());
}

TEST_CASE("a rank killed by a signal is reported as the signal, and dtrrun exits 128 + it") {
  const Finished run = run_dtrrun({"--nproc-per-node", "2", kProbe, "kill-if-rank", "0", "9", "sleep", kLongSleep});
  INFO("stderr:\n" << run.err);
  CHECK(run.exit_code == 128 + SIGKILL);
  CHECK_THAT(run.err, Catch::Contains("[dtrrun] rank 0 (local rank 0, pid "));
  CHECK_THAT(run.err, Catch::Contains(") was killed by signal 9 (SIGKILL)"));
}

TEST_CASE("a rank that ignores SIGTERM is killed after the grace period") {
  // Rank 0 fails only once rank 1 ignores SIGTERM (and has said so with its ready file).
  const fs::path dir = dtr::testing::make_temp_dir("launcher_test");
  const Finished run = finish(start_dtrrun(
      {"--nproc-per-node", "2", "--kill-grace-seconds", "0.5", kProbe, "ignore-sigterm", "ready", dir.string(),
       "wait-for", (dir / "ready.1").string(), "exit-if-rank", "0", "4", "sleep", kLongSleep},
      dir, "dtrrun"));
  INFO("stderr:\n" << run.err);
  CHECK(run.exit_code == 4);
  CHECK_THAT(run.err, Catch::Contains("[dtrrun] 1 rank(s) still running 0.5 s after the stop "
                                      "signal; sending SIGKILL"));
}

TEST_CASE("a rank killed from outside after a peer exited is still reported as the first failure") {
  // Rank 1 exits with a code; rank 0 ignores the SIGTERM that follows and dies of SIGKILL
  // 0.3 s later, long before dtrrun's own SIGKILL is due: a signal dtrrun did not send, as
  // when a rank killed from outside closes its sockets before it is a zombie and its peer
  // exits first on the reset connection.
  const fs::path dir = dtr::testing::make_temp_dir("launcher_test");
  const Finished run = finish(start_dtrrun({"--nproc-per-node",
                                            "2",
                                            "--kill-grace-seconds",
                                            "30",
                                            kProbe,
                                            "ignore-sigterm",
                                            "ready",
                                            dir.string(),
                                            "wait-for",
                                            (dir / "ready.1").string(),
                                            "wait-for",
                                            (dir / "ready.0").string(),
                                            "exit-if-rank",
                                            "1",
                                            "3",
                                            "sleep",
                                            "0.3",
                                            "kill-if-rank",
                                            "0",
                                            "9",
                                            "sleep",
                                            kLongSleep},
                                           dir, "dtrrun"));
  INFO("stderr:\n" << run.err);
  CHECK(run.exit_code == 128 + SIGKILL);
  CHECK_THAT(run.err, Catch::Contains(") exited with code 3; stopping the other 1 rank(s)"));
  CHECK_THAT(run.err, Catch::Contains(") was killed by signal 9 (SIGKILL) (not by dtrrun): the first failure"));
  CHECK_THAT(run.err, Catch::Contains("[dtrrun] failed after 1 attempt(s): rank 0 (local rank 0"));
}

TEST_CASE("SIGTERM and SIGINT sent to dtrrun reach every rank") {
  const int signal = GENERATE(SIGTERM, SIGINT);
  INFO("signal " << signal);
  const fs::path dir = dtr::testing::make_temp_dir("launcher_test");
  const Launch launch = start_dtrrun(
      {"--nproc-per-node", "2", kProbe, "on-signal", dir.string(), "ready", dir.string(), "sleep", kLongSleep}, dir,
      "dtrrun");
  // Both ranks have their handler installed once their ready files exist.
  wait_for_file(dir / "ready.0");
  wait_for_file(dir / "ready.1");
  REQUIRE(::kill(launch.pid, signal) == 0);
  const Finished run = finish(launch);
  INFO("stderr:\n" << run.err);
  CHECK(run.exit_code == 128 + signal);
  CHECK_THAT(run.err, Catch::Contains("[dtrrun] received " + std::string(signal == SIGTERM ? "SIGTERM" : "SIGINT") +
                                      "; forwarding it to 2 rank(s)"));
  for (const char* marker : {"signal.0", "signal.1"}) {
    INFO(marker);
    CHECK(std::stoi(read_file(dir / marker)) == signal);
  }
}

TEST_CASE("no rank outlives a dtrrun killed with SIGKILL") {
  const fs::path dir = dtr::testing::make_temp_dir("launcher_test");
  const Launch launch =
      start_dtrrun({"--nproc-per-node", "2", kProbe, "ready", dir.string(), "sleep", kLongSleep}, dir, "dtrrun");
  wait_for_file(dir / "ready.0");
  wait_for_file(dir / "ready.1");
  REQUIRE(::kill(launch.pid, SIGKILL) == 0);
  CHECK(finish(launch).exit_code == 128 + SIGKILL);
  for (const char* marker : {"ready.0", "ready.1"}) {
    const std::string pid = read_file(dir / marker);
    INFO(marker << ": pid " << pid);
    // Gone, or a zombie waiting for whichever process inherited it.
    const fs::path stat = fs::path("/proc") / pid / "stat";
    const auto deadline = Clock::now() + kDeadline;
    while (fs::exists(stat) && read_file(stat).find(") Z ") == std::string::npos) {
      REQUIRE(Clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

TEST_CASE("--max-restarts restarts the group with DTR_RESTART_COUNT counting attempts") {
  // The probe fails with code 5 on attempts 0 and 1 and succeeds on attempt 2.
  const std::vector<std::string> probe = {kProbe, "env", "fail-before-restart", "2", "5"};
  SECTION("two restarts are enough") {
    std::vector<std::string> args = {"--nproc-per-node", "2", "--max-restarts", "2"};
    args.insert(args.end(), probe.begin(), probe.end());
    const Finished run = run_dtrrun(args);
    INFO("stderr:\n" << run.err);
    CHECK(run.exit_code == 0);
    // The rank that fails first in an attempt has reported it; the other may be stopped
    // before it reports, except in the last attempt, which both finish.
    std::set<std::string> attempts;
    std::multiset<std::string> last_attempt_ranks;
    const auto envs = env_lines(run.out);
    for (const auto& env : envs) {
      attempts.insert(env.at("DTR_RESTART_COUNT"));
      if (env.at("DTR_RESTART_COUNT") == "2") last_attempt_ranks.insert(env.at("RANK"));
      CHECK(env.at("DTR_RUN_ID") == envs.front().at("DTR_RUN_ID"));
      CHECK(env.at("MASTER_PORT") == envs.front().at("MASTER_PORT"));
    }
    CHECK(attempts == std::set<std::string>{"0", "1", "2"});
    CHECK(last_attempt_ranks == std::multiset<std::string>{"0", "1"});
    CHECK_THAT(run.err, Catch::Contains("[dtrrun] restarting the local group (restart 1 of 2)"));
    CHECK_THAT(run.err, Catch::Contains("[dtrrun] restarting the local group (restart 2 of 2)"));
  }
  SECTION("one restart is not") {
    std::vector<std::string> args = {"--max_restarts", "1"};
    args.insert(args.end(), probe.begin(), probe.end());
    const Finished run = run_dtrrun(args);
    INFO("stderr:\n" << run.err);
    CHECK(run.exit_code == 5);
    CHECK_THAT(run.err, Catch::Contains("[dtrrun] failed after 2 attempt(s): rank 0 (local rank 0, pid "));
    CHECK_THAT(run.err, Catch::Contains(") exited with code 5"));
  }
}

TEST_CASE("every launch gets its own run id unless --run-id gives one") {
  const auto run_id = [](std::vector<std::string> flags) {
    flags.insert(flags.end(), {kProbe, "env"});
    const Finished run = run_dtrrun(flags);
    REQUIRE(run.exit_code == 0);
    const auto envs = env_lines(run.out);
    REQUIRE(envs.size() == 1);
    return envs.front().at("DTR_RUN_ID");
  };
  CHECK(run_id({}) != run_id({}));
  CHECK(run_id({"--run-id", "job7"}) == "job7");
  CHECK(run_id({"--rdzv_id", "job8"}) == "job8");
}

TEST_CASE("two nodes on loopback make one world of 4 ranks") {
  const int port = dtr::launcher::find_free_port("127.0.0.1");
  const fs::path dir = dtr::testing::make_temp_dir("launcher_test");
  std::vector<Launch> launches;
  for (int node = 0; node < 2; ++node) {
    launches.push_back(
        start_dtrrun({"--nnodes", "2", "--node_rank", std::to_string(node), "--nproc-per-node", "2", "--master-addr",
                      "127.0.0.1", "--master-port", std::to_string(port), "--run-id", "two-nodes", kProbe, "env"},
                     dir, "node" + std::to_string(node)));
  }
  std::multiset<std::string> ranks;
  for (int node = 0; node < 2; ++node) {
    const Finished run = finish(launches[node]);
    INFO("node " << node << " stderr:\n" << run.err);
    REQUIRE(run.exit_code == 0);
    CHECK_THAT(run.err, Catch::Contains(fmt::format("[dtrrun] node {} of 2: starting ranks {} .. {} of 4", node,
                                                    2 * node, 2 * node + 1)));
    const auto envs = env_lines(run.out);
    REQUIRE(envs.size() == 2);
    for (const auto& env : envs) {
      ranks.insert(env.at("RANK"));
      CHECK(env.at("prefix") == env.at("RANK"));
      CHECK(std::stoi(env.at("RANK")) == 2 * node + std::stoi(env.at("LOCAL_RANK")));
      CHECK(env.at("GROUP_RANK") == std::to_string(node));
      CHECK(env.at("WORLD_SIZE") == "4");
      CHECK(env.at("LOCAL_WORLD_SIZE") == "2");
      CHECK(env.at("MASTER_ADDR") == "127.0.0.1");
      CHECK(env.at("MASTER_PORT") == std::to_string(port));
      CHECK(env.at("DTR_RUN_ID") == "two-nodes");
    }
  }
  CHECK(ranks == std::multiset<std::string>{"0", "1", "2", "3"});
}

TEST_CASE("two launchers with --nnodes 2 form one Gloo world: an all_reduce spans all 4 ranks") {
  const int port = dtr::launcher::find_free_port("127.0.0.1");
  const fs::path dir = dtr::testing::make_temp_dir("launcher_test");
  std::vector<Launch> launches;
  for (int node = 0; node < 2; ++node) {
    launches.push_back(start_dtrrun({"--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node", "2",
                                     "--master-port", std::to_string(port), kCollectiveProbe, "all_reduce"},
                                    dir, "node" + std::to_string(node)));
  }
  int sums = 0;
  for (int node = 0; node < 2; ++node) {
    const Finished run = finish(launches[node]);
    INFO("node " << node << " stderr:\n" << run.err);
    REQUIRE(run.exit_code == 0);
    for (const RankLine& line : rank_lines(run.out)) {
      CHECK(line.text == "all_reduce sum 10 of 4 ranks");  // 1 + 2 + 3 + 4
      ++sums;
    }
  }
  CHECK(sums == 4);
}

TEST_CASE("a rank killed in the middle of a collective: dtrrun names it and stops the others") {
  const Finished run = run_dtrrun({"--nproc-per-node", "3", kCollectiveProbe, "die_in_collective", "1"});
  INFO("stderr:\n" << run.err);
  CHECK(run.exit_code == 128 + SIGKILL);
  CHECK_THAT(run.err, Catch::Contains("rank 1 (local rank 1") && Catch::Contains("killed by signal 9"));
}

TEST_CASE("bad command lines exit non-zero with a message naming the mistake") {
  const fs::path dir = dtr::testing::make_temp_dir("launcher_test");
  const fs::path not_executable = dir / "data.txt";
  std::ofstream(not_executable) << "not a program\n";
  const fs::path bad_format = dir / "bad_format";
  std::ofstream(bad_format) << "neither ELF nor #!";
  fs::permissions(bad_format, fs::perms::owner_all);
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--nproc-per-node", "2"}, 2, "[dtrrun] error: no program to run"},
      {{"--nproc-per-node", "0", kProbe}, 2, "--nproc-per-node must be from 1 to 1024, got 0"},
      {{"--nnodes", "0", kProbe}, 2, "--nnodes must be at least 1, got 0"},
      {{"--nnodes", "2", kProbe}, 2, "--master-port is required with --nnodes 2: every node must pass the same port"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-port", "29500", kProbe},
       2,
       "--node-rank 2 is out of range for --nnodes 2 (0 .. 1)"},
      {{"--master-port", "70000", kProbe}, 2, "--master-port must be in 1 .. 65535"},
      {{"--max-restarts", "-1", kProbe}, 2, "--max-restarts must be at least 0, got -1"},
      {{"--kill-grace-seconds", "-2", kProbe}, 2, "--kill-grace-seconds must be in 0 .. 3600"},
      {{"--nproc-per-node", "two", kProbe}, 2, "--nproc-per-node"},
      {{"--bogus", kProbe}, 2, "unknown flag '--bogus'"},
      {{"no-such-program-dtr"}, 1, "program 'no-such-program-dtr' was not found in PATH"},
      {{not_executable.string()}, 1, "is not an executable file"},
      {{"--nproc-per-node", "2", bad_format.string()},
       1,
       "[dtrrun] error: cannot start '" + bad_format.string() + "': Exec format error"},
      {{"--master-addr", "no-such-host.invalid", kProbe}, 1, "cannot resolve master address 'no-such-host.invalid'"},
  };
  for (const Case& c : cases) {
    std::string joined;
    for (const std::string& arg : c.args) joined += " " + arg;
    INFO("dtrrun" << joined);
    const Finished run = run_dtrrun(c.args);
    INFO("stderr:\n" << run.err);
    CHECK(run.exit_code == c.exit_code);
    CHECK_THAT(run.err, Catch::Contains(c.message));
    CHECK(run.out.empty());
  }
}

TEST_CASE("the program's own flags after its name are passed through untouched") {
  // "--nproc-per-node 3" after the program belongs to the program (and is an unknown
  // action there), and "--" before the program is dropped.
  const Finished run = run_dtrrun({"--", kProbe, "stderr", "--nproc-per-node", "env"});
  INFO("stderr:\n" << run.err);
  CHECK(run.exit_code == 0);
  CHECK_THAT(run.err, Catch::Contains("[rank0]: --nproc-per-node"));
  CHECK(env_lines(run.out).size() == 1);
}
