#include "tests/train/train_runner.h"

#include <fmt/format.h>
#include <sys/wait.h>

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

}  // namespace dtr::testing
