// docs/sharding_rules.md and the op headers agree: every DTensor op declared in
// dtensor/ops/*.h has a row in the table (with its family file), and every row names a
// declared op. Runs on the files themselves (Bazel data dependencies).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_CASE("docs/sharding_rules.md lists exactly the ops of dtensor/ops", "[dtensor][docs]") {
  // op -> family (the header's stem), from declarations starting a line.
  std::map<std::string, std::string> declared;
  const std::regex declaration(R"(^(?:DTensor|std::vector<DTensor>) ([a-z_0-9]+)\()", std::regex::multiline);
  for (const auto& entry : fs::directory_iterator("dtensor/ops")) {
    if (entry.path().extension() != ".h") continue;
    const std::string text = read(entry.path());
    for (std::sregex_iterator it(text.begin(), text.end(), declaration), end; it != end; ++it) {
      declared[(*it)[1]] = entry.path().stem().string();
    }
  }
  REQUIRE(declared.size() > 40);
  std::map<std::string, std::string> documented;
  const std::regex row(R"(^\| `([a-z_0-9]+)` \| ([a-z_]+) \|)", std::regex::multiline);
  const std::string doc = read("docs/sharding_rules.md");
  for (std::sregex_iterator it(doc.begin(), doc.end(), row), end; it != end; ++it) documented[(*it)[1]] = (*it)[2];
  for (const auto& [op, family] : declared) {
    INFO("op " << op << " declared in dtensor/ops/" << family << ".h");
    REQUIRE(documented.count(op) == 1);
    CHECK(documented.at(op) == family);
  }
  for (const auto& [op, family] : documented) {
    INFO("docs/sharding_rules.md has a row for " << op);
    CHECK(declared.count(op) == 1);
  }
}

}  // namespace
