#include "dtensor/placement.h"

#include <cctype>
#include <charconv>
#include <optional>

#include "core/error.h"

namespace dtr {

Placement Shard(int64_t dim) { return Placement(Placement::Kind::kShard, dim, 1, ReduceOp::kSum); }
Placement StridedShard(int64_t dim, int64_t split_factor) {
  DTR_CHECK(split_factor >= 1, ValueError,
            "StridedShard(dim={}, split_factor={}): the split factor counts blocks and must be >= 1", dim,
            split_factor);
  if (split_factor == 1) return Shard(dim);
  return Placement(Placement::Kind::kStridedShard, dim, split_factor, ReduceOp::kSum);
}
Placement Replicate() { return Placement(Placement::Kind::kReplicate, 0, 1, ReduceOp::kSum); }
Placement Partial(ReduceOp op) { return Placement(Placement::Kind::kPartial, 0, 1, op); }

int64_t Placement::shard_dim() const {
  DTR_CHECK(splits_a_dim(), ValueError,
            "Placement.shard_dim: {} is not a Shard or StridedShard placement; only they have a shard dim (test "
            "splits_a_dim() first)",
            repr());
  return dim_;
}

int64_t Placement::split_factor() const {
  DTR_CHECK(splits_a_dim(), ValueError,
            "Placement.split_factor: {} is not a Shard or StridedShard placement; only they split a dim (test "
            "splits_a_dim() first)",
            repr());
  return split_factor_;
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
    case Kind::kStridedShard: return fmt::format("StridedShard(dim={}, split_factor={})", dim_, split_factor_);
    case Kind::kReplicate: return "Replicate()";
    case Kind::kPartial: return fmt::format("Partial({})", reduce_op_name(op_));
  }
  return "?";
}

std::string Placement::str() const {
  switch (kind_) {
    case Kind::kShard: return fmt::format("S({})", dim_);
    case Kind::kStridedShard: return fmt::format("SS({},{})", dim_, split_factor_);
    case Kind::kReplicate: return "R";
    case Kind::kPartial: return fmt::format("P({})", reduce_op_name(op_));
  }
  return "?";
}

size_t Placement::hash() const {
  const uint64_t bits = (static_cast<uint64_t>(kind_) << 56) ^ (static_cast<uint64_t>(op_) << 48) ^
                        (static_cast<uint64_t>(split_factor_) << 24) ^ static_cast<uint64_t>(dim_);
  return std::hash<uint64_t>{}(bits);
}

namespace {

[[noreturn]] void throw_parse_error(std::string_view text) {
  throw ValueError(
      fmt::format("parse_placement: cannot read '{}' as a placement; expected one of S(0), S0, Shard(dim=0), R, "
                  "Replicate(), P, P(sum), Psum, Partial(sum) (reduce ops: sum, avg, max, min), SS(0,3), "
                  "StridedShard(dim=0, split_factor=3)",
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

// The integer `digits` (after an optional "name="), or nullopt.
std::optional<int64_t> parse_int(std::string_view digits, std::string_view name) {
  digits = trim(digits);
  if (digits.starts_with(name) && digits.substr(name.size()).starts_with("=")) digits.remove_prefix(name.size() + 1);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

}  // namespace

Placement parse_placement(std::string_view text) {
  const std::string_view t = trim(text);
  if (t.empty()) throw_parse_error(text);
  if (t.starts_with("SS(") || t.starts_with("StridedShard(")) {
    if (t.back() != ')') throw_parse_error(text);
    const std::string_view args = t.substr(t.find('(') + 1, t.size() - t.find('(') - 2);
    const size_t comma = args.find(',');
    if (comma == std::string_view::npos) throw_parse_error(text);
    const std::optional<int64_t> dim = parse_int(args.substr(0, comma), "dim");
    const std::optional<int64_t> factor = parse_int(args.substr(comma + 1), "split_factor");
    if (!dim || !factor) throw_parse_error(text);
    return StridedShard(*dim, *factor);
  }
  if (t.front() == 'S') {
    std::optional<std::string_view> arg = placement_argument(t, "Shard");
    if (!arg) throw_parse_error(text);
    const std::optional<int64_t> dim = parse_int(*arg, "dim");
    if (!dim) throw_parse_error(text);
    return Shard(*dim);
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

Placements reduced_placements(Placements placements) {
  for (Placement& p : placements) {
    if (p.is_partial()) p = Replicate();
  }
  return placements;
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
