#include "dtensor/placement.h"

#include <cctype>
#include <charconv>
#include <optional>

#include "core/error.h"

namespace dtr {

Placement Shard(int64_t dim) { return Placement(Placement::Kind::kShard, dim, ReduceOp::kSum); }
Placement Replicate() { return Placement(Placement::Kind::kReplicate, 0, ReduceOp::kSum); }
Placement Partial(ReduceOp op) { return Placement(Placement::Kind::kPartial, 0, op); }

int64_t Placement::shard_dim() const {
  DTR_CHECK(is_shard(), ValueError,
            "Placement.shard_dim: {} is not a Shard placement; only Shard(dim) has a shard dim (test is_shard() "
            "first)",
            repr());
  return dim_;
}

ReduceOp Placement::reduce_op() const {
  DTR_CHECK(is_partial(), ValueError,
            "Placement.reduce_op: {} is not a Partial placement; only Partial(op) has a reduce op (test "
            "is_partial() first)",
            repr());
  return op_;
}

std::string Placement::repr() const {
  switch (kind_) {
    case Kind::kShard: return fmt::format("Shard(dim={})", dim_);
    case Kind::kReplicate: return "Replicate()";
    case Kind::kPartial: return fmt::format("Partial({})", reduce_op_name(op_));
  }
  return "?";
}

std::string Placement::str() const {
  switch (kind_) {
    case Kind::kShard: return fmt::format("S({})", dim_);
    case Kind::kReplicate: return "R";
    case Kind::kPartial: return fmt::format("P({})", reduce_op_name(op_));
  }
  return "?";
}

size_t Placement::hash() const {
  const uint64_t bits =
      (static_cast<uint64_t>(kind_) << 56) ^ (static_cast<uint64_t>(op_) << 48) ^ static_cast<uint64_t>(dim_);
  return std::hash<uint64_t>{}(bits);
}

namespace {

[[noreturn]] void throw_parse_error(std::string_view text) {
  throw ValueError(
      fmt::format("parse_placement: cannot read '{}' as a placement; expected one of S(0), S0, Shard(dim=0), R, "
                  "Replicate(), P, P(sum), Psum, Partial(sum) (reduce ops: sum, avg, max, min)",
                  text));
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The argument after a placement's name: "Shard(dim=0)" -> "dim=0", "S0" -> "0", "R" -> "".
// nullopt when the name is missing or the parentheses are unbalanced.
std::optional<std::string_view> placement_argument(std::string_view s, std::string_view long_name) {
  if (s.starts_with(long_name)) {
    s.remove_prefix(long_name.size());
  } else if (s.front() == long_name.front()) {
    s.remove_prefix(1);
  }
  if (s.empty() || s.front() != '(') {
    return s.find_first_of("()") == std::string_view::npos ? std::optional(s) : std::nullopt;
  }
  if (s.back() != ')') return std::nullopt;
  return s.substr(1, s.size() - 2);
}

}  // namespace

Placement parse_placement(std::string_view text) {
  const std::string_view t = trim(text);
  if (t.empty()) throw_parse_error(text);
  if (t.front() == 'S') {
    std::optional<std::string_view> arg = placement_argument(t, "Shard");
    if (!arg) throw_parse_error(text);
    std::string_view digits = arg->starts_with("dim=") ? arg->substr(4) : *arg;
    int64_t dim = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), dim);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) throw_parse_error(text);
    return Shard(dim);
  }
  if (t.front() == 'R') {
    std::optional<std::string_view> arg = placement_argument(t, "Replicate");
    if (!arg || !arg->empty()) throw_parse_error(text);
    return Replicate();
  }
  if (t.front() == 'P') {
    std::optional<std::string_view> arg = placement_argument(t, "Partial");
    if (!arg) throw_parse_error(text);
    if (arg->empty()) {
      DTR_CHECK(!t.ends_with("()"), ValueError,
                "parse_placement: '{}' names no reduce op; write P or P(sum) for a sum, or one of P(avg), P(max), "
                "P(min)",
                text);
      return Partial(ReduceOp::kSum);
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      if (*arg == reduce_op_name(op)) return Partial(op);
    }
  }
  throw_parse_error(text);
}

Placements parse_placements(std::string_view text) {
  // Split on commas outside parentheses.
  Placements result;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] == '(') ++depth;
    if (i < text.size() && text[i] == ')') --depth;
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      result.push_back(parse_placement(text.substr(start, i - start)));
      start = i + 1;
    }
  }
  return result;
}

std::string placements_str(const Placements& placements) { return fmt::format("({})", fmt::join(placements, ", ")); }

}  // namespace dtr
