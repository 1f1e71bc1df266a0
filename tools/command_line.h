// command_line: a tool's flags parsed with CLI11 the same way in every dtr tool, and the
// validators whose messages name the value and what is legal.
//
// A bad command line is one line on stderr, "<tool>: <flag>: got '<value>'; legal: <what>"
// (or CLI11's own words where they already say it), and exit code 1, never CLI11's
// codes 105-114; --help prints the help and exits 0. A flag given twice is an error naming
// it, and an unknown subcommand is named with the legal ones.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dtr {

// Parses argv into `app`: nullopt when the tool should go on, else the exit code to return
// (0 after --help, 1 after the one line for a bad command line).
std::optional<int> parse_command_line(std::string_view tool, CLI::App& app, int argc, char** argv);

// A whole number in [min, max].
CLI::Validator whole_number(int64_t min, int64_t max = INT64_MAX);
// A whole number in [0, 2^64) (seeds).
CLI::Validator unsigned_whole_number();
// A finite real number above `min` (Bound::kOpen) or at least `min` (kClosed), at most `max`.
enum class Bound { kOpen, kClosed };
CLI::Validator finite_number(double min, Bound bound, double max = 1e300);

}  // namespace dtr
