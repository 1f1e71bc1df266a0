#include "collectives/cost_model.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace dtr {
namespace {

constexpr std::string_view kFormat = "dtr-cost-model";
constexpr int kVersion = 1;

// "all_reduce on 2 ranks", for messages.
std::string fit_label(CollectiveKind kind, int64_t group_size) {
  return fmt::format("{} on {} ranks", collective_kind_name(kind), group_size);
}

void check_alpha_beta(const AlphaBeta& f, std::string_view op, CollectiveKind kind, int64_t group_size) {
  DTR_CHECK(group_size >= 2, ValueError, "{}: {}: a fit needs a group of at least 2 ranks (a group of 1 costs nothing)",
            op, fit_label(kind, group_size));
  DTR_CHECK(std::isfinite(f.alpha_s) && f.alpha_s >= 0, ValueError, "{}: {}: alpha_s = {}: a latency is >= 0 seconds",
            op, fit_label(kind, group_size), f.alpha_s);
  DTR_CHECK(std::isfinite(f.beta_bytes_per_s) && f.beta_bytes_per_s > 0, ValueError,
            "{}: {}: beta_bytes_per_s = {}: a bandwidth is > 0 bytes per second", op, fit_label(kind, group_size),
            f.beta_bytes_per_s);
}

// alpha and beta minimising the sum of squared relative errors, sum_i ((alpha + x_i b -
// t_i) / t_i)^2 with b = 1/beta: each size counts alike. Ordinary least squares on time
// would let the largest messages (1000x the time of the smallest) decide alpha too, which
// then comes out at the noise of a 50 ms call, often negative. Dividing by t_i makes it a
// linear fit of 1 by the columns u = 1/t and v = x/t; both are scaled to unit norm first,
// since they differ by the magnitude of the bytes.
AlphaBeta fit_alpha_beta(std::span<const CostSample> points) {
  const CollectiveKind kind = points.front().kind;
  const int64_t group_size = points.front().group_size;
  std::set<int64_t> sizes;
  double uu = 0, uv = 0, vv = 0, u1 = 0, v1 = 0;
  for (const CostSample& p : points) {
    DTR_CHECK(p.bytes >= 0 && std::isfinite(p.seconds) && p.seconds > 0, ValueError,
              "CostModel::fit: {}: a sample of {} bytes in {} s: bytes must be >= 0 and seconds > 0",
              fit_label(kind, group_size), p.bytes, p.seconds);
    sizes.insert(p.bytes);
    const double u = 1 / p.seconds, v = static_cast<double>(p.bytes) / p.seconds;
    uu += u * u, uv += u * v, vv += v * v, u1 += u, v1 += v;
  }
  DTR_CHECK(sizes.size() >= 2, ValueError,
            "CostModel::fit: {}: samples of {} distinct size(s); alpha and beta need at least 2 sizes",
            fit_label(kind, group_size), sizes.size());
  const double nu = std::sqrt(uu), nv = std::sqrt(vv), c = uv / (nu * nv), p = u1 / nu, q = v1 / nv;
  double alpha = (p - c * q) / (1 - c * c) / nu;
  double b = (q - c * p) / (1 - c * c) / nv;
  if (alpha < 0) {  // clamped: the best fit through the origin
    alpha = 0;
    b = v1 / vv;
  }
  DTR_CHECK(b > 0, ValueError,
            "CostModel::fit: {}: the time does not grow with the bytes (fitted 1/beta = {} s/B); measure sizes "
            "further apart",
            fit_label(kind, group_size), b);
  return {alpha, 1 / b};
}

CollectiveKind parse_kind(const std::string& name, const std::string& path) {
  if (const std::optional<CollectiveKind> kind = collective_kind_from_name(name)) return *kind;
  throw ValueError(
      fmt::format("CostModel::load: '{}': unknown collective kind '{}'; known: all_reduce, all_gather, reduce_scatter, "
                  "all_to_all, broadcast, barrier",
                  path, name));
}

}  // namespace

CostModel::CostModel(std::string machine, std::string backend)
    : machine_(std::move(machine)), backend_(std::move(backend)) {}

CostModel CostModel::fit(std::span<const CostSample> samples, std::string machine, std::string backend) {
  std::map<std::pair<CollectiveKind, int64_t>, std::vector<CostSample>> groups;
  for (const CostSample& s : samples) groups[{s.kind, s.group_size}].push_back(s);
  CostModel model(std::move(machine), std::move(backend));
  for (const auto& [key, points] : groups) {
    const AlphaBeta f = fit_alpha_beta(points);
    check_alpha_beta(f, "CostModel::fit", key.first, key.second);
    model.fits_[key] = f;
  }
  return model;
}

void CostModel::set(CollectiveKind kind, int64_t group_size, AlphaBeta fit) {
  check_alpha_beta(fit, "CostModel::set", kind, group_size);
  fits_[{kind, group_size}] = fit;
}

std::optional<AlphaBeta> CostModel::alpha_beta(CollectiveKind kind, int64_t group_size) const {
  DTR_CHECK(group_size >= 2, ValueError, "CostModel::alpha_beta: {}: give a group of at least 2 ranks",
            fit_label(kind, group_size));
  std::optional<int64_t> nearest;
  for (const auto& [key, fit] : fits_) {
    if (key.first != kind) continue;
    // Sizes come in increasing order, so `<=` makes a tie go to the larger.
    if (!nearest || std::abs(key.second - group_size) <= std::abs(*nearest - group_size)) nearest = key.second;
  }
  if (!nearest) return std::nullopt;
  const AlphaBeta f = fits_.at({kind, *nearest});
  const double n = static_cast<double>(group_size), n0 = static_cast<double>(*nearest);
  return AlphaBeta{f.alpha_s * (n - 1) / (n0 - 1), f.beta_bytes_per_s * ((n0 - 1) / n0) / ((n - 1) / n)};
}

std::optional<double> CostModel::predict_seconds(CollectiveKind kind, int64_t group_size, int64_t bytes) const {
  DTR_CHECK(group_size >= 1 && bytes >= 0, ValueError,
            "CostModel::predict_seconds: {}: {} bytes: give a group of at least 1 rank and bytes >= 0",
            fit_label(kind, group_size), bytes);
  if (group_size == 1) return 0.0;
  const std::optional<AlphaBeta> f = alpha_beta(kind, group_size);
  if (!f) return std::nullopt;
  return f->seconds(bytes);
}

RelativeError CostModel::relative_error(std::span<const CostSample> samples) const {
  DTR_CHECK(!samples.empty(), ValueError, "CostModel::relative_error: no samples");
  std::vector<double> errors;
  for (const CostSample& s : samples) {
    const std::optional<double> predicted = predict_seconds(s.kind, s.group_size, s.bytes);
    DTR_CHECK(predicted.has_value(), ValueError, "CostModel::relative_error: {}: the model has no {} fit",
              fit_label(s.kind, s.group_size), collective_kind_name(s.kind));
    errors.push_back(std::abs(*predicted - s.seconds) / s.seconds);
  }
  std::sort(errors.begin(), errors.end());
  const size_t m = errors.size() / 2;
  return {errors.size() % 2 ? errors[m] : (errors[m - 1] + errors[m]) / 2, errors.back()};
}

void CostModel::save(const std::string& path) const {
  nlohmann::ordered_json fits = nlohmann::ordered_json::array();
  for (const auto& [key, f] : fits_) {
    fits.push_back({{"kind", collective_kind_name(key.first)},
                    {"group_size", key.second},
                    {"alpha_s", f.alpha_s},
                    {"beta_bytes_per_s", f.beta_bytes_per_s}});
  }
  const nlohmann::ordered_json j = {
      {"format", kFormat}, {"version", kVersion}, {"machine", machine_}, {"backend", backend_}, {"fits", fits}};
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) throw OSError(errno, fmt::format("CostModel::save: writing '{}'", path));
}

CostModel CostModel::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw OSError(errno, fmt::format("CostModel::load: opening '{}'", path));
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    const std::string format = j.at("format").get<std::string>();
    const int version = j.at("version").get<int>();
    DTR_CHECK(format == kFormat && version == kVersion, ValueError,
              "CostModel::load: '{}' is format '{}' version {}; this build reads '{}' version {}", path, format,
              version, kFormat, kVersion);
    CostModel model(j.at("machine").get<std::string>(), j.at("backend").get<std::string>());
    for (const nlohmann::json& f : j.at("fits")) {
      const CollectiveKind kind = parse_kind(f.at("kind").get<std::string>(), path);
      const int64_t group_size = f.at("group_size").get<int64_t>();
      const AlphaBeta fit{f.at("alpha_s").get<double>(), f.at("beta_bytes_per_s").get<double>()};
      DTR_CHECK(!model.fits_.contains({kind, group_size}), ValueError, "CostModel::load: '{}': {} appears twice", path,
                fit_label(kind, group_size));
      check_alpha_beta(fit, fmt::format("CostModel::load: '{}'", path), kind, group_size);
      model.fits_[{kind, group_size}] = fit;
    }
    return model;
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(fmt::format("CostModel::load: '{}' is not a cost model file: {}", path, e.what()));
  }
}

}  // namespace dtr
