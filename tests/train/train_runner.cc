#include "tests/train/train_runner.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace dtr::testing {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

CommandResult run_command(const std::string& command, const std::filesystem::path& log) {
  const int status = std::system(fmt::format("{} > {} 2>&1 < /dev/null", command, log.string()).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), read_file(log)};
}

std::vector<double> losses_in(const std::filesystem::path& metrics, size_t ranks) {
  std::vector<double> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    losses.push_back(j.at("loss").get<double>());
    CHECK(j.at("peak_bytes").size() == ranks);
  }
  return losses;
}

std::filesystem::path fresh_dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TrainRun run_train(const std::string& name, int ranks, const std::string& flags) {
  const std::filesystem::path dir = fresh_dir(name);
  const std::string program = ranks == 0 ? kTrain : fmt::format("{} --nproc-per-node {} {}", kDtrrun, ranks, kTrain);
  TrainRun run{run_command(fmt::format("{} {} --out {}", program, flags, (dir / "out").string()), dir / "output.txt"),
               dir / "out"};
  INFO(run.result.output);
  REQUIRE(run.result.exit_code == 0);
  return run;
}

std::vector<double> train_losses(const std::string& name, int ranks, const std::string& flags) {
  const TrainRun run = run_train(name, ranks, flags);
  return losses_in(run.out / "metrics.jsonl", static_cast<size_t>(std::max(ranks, 1)));
}

void check_same_losses(const std::vector<double>& got, const std::vector<double>& expected, double tolerance) {
  REQUIRE(got.size() == expected.size());
  for (size_t s = 0; s < got.size(); ++s) {
    INFO("step " << s + 1);
    CHECK(got[s] == Approx(expected[s]).epsilon(tolerance));
  }
}

}  // namespace dtr::testing
