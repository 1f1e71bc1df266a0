#include "tools/command_line.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace dtr {
namespace {

// The one line for a parse error, in dtr's words where CLI11's do not name what is legal.
std::string error_line(std::string_view tool, const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  const std::string what = e.what();
  if (const size_t at = what.find(": At Most 1 required but received"); at != std::string::npos) {
    return fmt::format("{}: given more than once; give it once", what.substr(0, at));
  }
  const std::vector<const CLI::App*> commands = app.get_subcommands([](const CLI::App*) { return true; });
  if (!commands.empty() && argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* c : commands) {
      names += fmt::format("{}{}", names.empty() ? "" : ", ", c->get_name());
      known = known || c->get_name() == argv[1];
    }
    if (!known) return fmt::format("unknown command '{}'; the commands are {}", argv[1], names);
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) return fmt::format("{} ({} --help lists them)", what, tool);
  return what;
}

// Makes a flag given twice an error, as an option given twice is: CLI11 keeps a flag's last
// value, so "--mixed-precision --mixed-precision=false" would turn it off without a word.
void refuse_repeated_flags(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    // A flag (no value expected) that keeps its last value, as CLI11's bool flags do.
    if (o->get_expected_max() == 0 && o->get_multi_option_policy() == CLI::MultiOptionPolicy::TakeLast) {
      o->multi_option_policy(CLI::MultiOptionPolicy::Throw);
    }
  }
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) refuse_repeated_flags(*sub);
}

}  // namespace

std::optional<int> parse_command_line(std::string_view tool, CLI::App& app, int argc, char** argv) {
  refuse_repeated_flags(app);
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& e) {  // --help, --help-all, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "{}: {}\n", tool, error_line(tool, app, e, argc, argv));
    std::fflush(stderr);
    return 1;
  }
}

CLI::Validator whole_number(int64_t min, int64_t max) {
  const std::string legal = max == INT64_MAX ? fmt::format("a whole number >= {}", min)
                                             : fmt::format("a whole number from {} to {}", min, max);
  return CLI::Validator(
      [min, max, legal](std::string& text) -> std::string {
        int64_t n = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
        const bool ok = !text.empty() && error == std::errc() && end == text.data() + text.size();
        return ok && n >= min && n <= max ? "" : fmt::format("got '{}'; legal: {}", text, legal);
      },
      max == INT64_MAX ? fmt::format("INT>={}", min) : fmt::format("INT in [{}, {}]", min, max));
}

CLI::Validator unsigned_whole_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t n = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
        const bool ok = !text.empty() && error == std::errc() && end == text.data() + text.size();
        return ok ? "" : fmt::format("got '{}'; legal: a whole number from 0 to {}", text, UINT64_MAX);
      },
      "UINT");
}

CLI::Validator finite_number(double min, Bound bound, double max) {
  const std::string lower = fmt::format("{} {}", bound == Bound::kOpen ? ">" : ">=", min);
  const std::string legal =
      max >= 1e300 ? fmt::format("a finite number {}", lower) : fmt::format("a finite number {} and <= {}", lower, max);
  return CLI::Validator(
      [min, bound, max, legal](std::string& text) -> std::string {
        size_t used = 0;
        double x = NAN;
        try {
          x = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool ok =
            used == text.size() && std::isfinite(x) && (bound == Bound::kOpen ? x > min : x >= min) && x <= max;
        return ok ? "" : fmt::format("got '{}'; legal: {}", text, legal);
      },
      fmt::format("NUMBER {}", lower));
}

}  // namespace dtr
