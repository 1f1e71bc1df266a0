// CostModel: the fit recovers alpha and beta from synthetic measurements (exact, and with
// seeded multiplicative noise), clamps alpha < 0 and refuses beta <= 0; the JSON round trip;
// bad files are errors naming the file; group sizes without a fit follow the ring rule.
#include "collectives/cost_model.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::MessageContains;

constexpr CollectiveKind kAllReduce = CollectiveKind::kAllReduce;
constexpr CollectiveKind kAllGather = CollectiveKind::kAllGather;

// collective_bench's sizes: 4 KiB to 64 MiB, growing 4x; seconds = truth(bytes) x
// (1 + noise), noise uniform in [-spread, spread].
std::vector<CostSample> samples(CollectiveKind kind, int64_t group_size, AlphaBeta truth, double spread = 0,
                                uint64_t seed = 1) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> noise(-spread, spread);
  std::vector<CostSample> out;
  for (int64_t bytes = 4 << 10; bytes <= 64 << 20; bytes *= 4) {
    out.push_back({kind, group_size, bytes, truth.seconds(bytes) * (1 + noise(gen))});
  }
  return out;
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = (testing::make_temp_dir("cost_model") / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST_CASE("the fit recovers alpha and beta from exact measurements", "[cost_model]") {
  const AlphaBeta ar{150e-6, 1.2e9}, ag{40e-6, 3e9};
  std::vector<CostSample> all = samples(kAllReduce, 2, ar);
  const std::vector<CostSample> gather = samples(kAllGather, 4, ag);
  all.insert(all.end(), gather.begin(), gather.end());
  const CostModel model = CostModel::fit(all, "test machine", "gloo");
  REQUIRE(model.fits().size() == 2);
  const AlphaBeta got_ar = model.fits().at({kAllReduce, 2}), got_ag = model.fits().at({kAllGather, 4});
  CHECK(got_ar.alpha_s == Approx(ar.alpha_s).epsilon(1e-9));
  CHECK(got_ar.beta_bytes_per_s == Approx(ar.beta_bytes_per_s).epsilon(1e-9));
  CHECK(got_ag.alpha_s == Approx(ag.alpha_s).epsilon(1e-9));
  CHECK(got_ag.beta_bytes_per_s == Approx(ag.beta_bytes_per_s).epsilon(1e-9));
  const RelativeError error = model.relative_error(all);
  CHECK(error.worst < 1e-9);
}

TEST_CASE("the fit recovers alpha and beta from noisy measurements", "[cost_model]") {
  const AlphaBeta truth{200e-6, 1.5e9};
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    const std::vector<CostSample> noisy = samples(kAllReduce, 2, truth, 0.05, seed);
    const AlphaBeta got = CostModel::fit(noisy, "m", "gloo").fits().at({kAllReduce, 2});
    // 5% noise on each point: the fit is within 10% of the truth, and within the noise of the points.
    CHECK(got.alpha_s == Approx(truth.alpha_s).epsilon(0.10));
    CHECK(got.beta_bytes_per_s == Approx(truth.beta_bytes_per_s).epsilon(0.10));
    CHECK(CostModel::fit(noisy, "m", "gloo").relative_error(noisy).worst < 0.10);
  }
}

TEST_CASE("a fit with alpha < 0 is clamped to 0; beta <= 0 and bad samples are refused", "[cost_model]") {
  // seconds = bytes / 1e9 - 10 us: the unclamped fit has alpha = -10 us.
  std::vector<CostSample> negative;
  for (int64_t bytes = 1 << 20; bytes <= 64 << 20; bytes *= 4)
    negative.push_back({kAllGather, 2, bytes, bytes / 1e9 - 1e-5});
  const AlphaBeta clamped = CostModel::fit(negative, "m", "gloo").fits().at({kAllGather, 2});
  CHECK(clamped.alpha_s == 0);
  // Refitted through the origin: every time is under bytes / 1e9, so the slope is under 1e-9 s/B.
  CHECK(clamped.beta_bytes_per_s > 1.001e9);
  CHECK(clamped.beta_bytes_per_s < 1.01e9);

  const std::vector<CostSample> shrinking = {{kAllGather, 2, 1024, 2e-3}, {kAllGather, 2, 1 << 20, 1e-3}};
  CHECK_THROWS_MATCHES(CostModel::fit(shrinking, "m", "gloo"), ValueError,
                       MessageContains("all_gather on 2 ranks: the time does not grow with the bytes"));
  const std::vector<CostSample> one_size = {{kAllReduce, 4, 1024, 1e-3}, {kAllReduce, 4, 1024, 2e-3}};
  CHECK_THROWS_MATCHES(CostModel::fit(one_size, "m", "gloo"), ValueError,
                       MessageContains("all_reduce on 4 ranks: samples of 1 distinct size(s)"));
  const std::vector<CostSample> one_rank = samples(kAllReduce, 1, {1e-5, 1e9});
  CHECK_THROWS_MATCHES(CostModel::fit(one_rank, "m", "gloo"), ValueError,
                       MessageContains("all_reduce on 1 ranks: a fit needs a group of at least 2 ranks"));
  const std::vector<CostSample> zero_time = {{kAllReduce, 2, 1024, 0.0}, {kAllReduce, 2, 4096, 1e-3}};
  CHECK_THROWS_MATCHES(CostModel::fit(zero_time, "m", "gloo"), ValueError,
                       MessageContains("a sample of 1024 bytes in 0 s"));
}

TEST_CASE("group sizes without a fit scale the nearest fitted size as a ring does", "[cost_model]") {
  CostModel model("m", "gloo");
  model.set(kAllReduce, 2, {100e-6, 2e9});
  model.set(kAllReduce, 8, {1400e-6, 1e9});
  // A fitted size is its own fit.
  CHECK(*model.predict_seconds(kAllReduce, 2, 2'000'000) == Approx(100e-6 + 1e-3));
  // 4: nearest 2; alpha x (4-1)/(2-1), 1/beta x (3/4)/(1/2).
  const AlphaBeta four = *model.alpha_beta(kAllReduce, 4);
  CHECK(four.alpha_s == Approx(300e-6));
  CHECK(four.beta_bytes_per_s == Approx(2e9 / 1.5));
  CHECK(*model.predict_seconds(kAllReduce, 4, 2'000'000) == Approx(300e-6 + 1.5e-3));
  // 5: 3 from 2 and from 8, a tie: the larger, 8; alpha x 4/7, 1/beta x (4/5)/(7/8).
  const AlphaBeta five = *model.alpha_beta(kAllReduce, 5);
  CHECK(five.alpha_s == Approx(1400e-6 * 4 / 7));
  CHECK(five.beta_bytes_per_s == Approx(1e9 * (7.0 / 8) / (4.0 / 5)));
  // 16: nearest 8.
  CHECK(model.alpha_beta(kAllReduce, 16)->alpha_s == Approx(1400e-6 * 15 / 7));
  // One rank costs nothing; a kind with no fit predicts nothing.
  CHECK(*model.predict_seconds(kAllReduce, 1, 1 << 20) == 0);
  CHECK_FALSE(model.predict_seconds(CollectiveKind::kAllToAll, 2, 1 << 20).has_value());
  CHECK_THROWS_MATCHES(model.predict_seconds(kAllReduce, 2, -1), ValueError,
                       MessageContains("all_reduce on 2 ranks: -1 bytes"));
  CHECK_THROWS_MATCHES(model.set(kAllGather, 2, {1e-5, 0}), ValueError,
                       MessageContains("CostModel::set: all_gather on 2 ranks: beta_bytes_per_s = 0"));
}

TEST_CASE("a model round-trips through its JSON file", "[cost_model]") {
  CostModel model("2-core test VM, loopback TCP", "gloo");
  model.set(kAllReduce, 2, {123.456e-6, 1.234e9});
  model.set(kAllGather, 4, {1e-5, 3.5e9});
  model.set(CollectiveKind::kBroadcast, 2, {0, 2e9});
  const std::string path = (testing::make_temp_dir("cost_model") / "model.json").string();
  model.save(path);
  const CostModel loaded = CostModel::load(path);
  CHECK(loaded.machine() == model.machine());
  CHECK(loaded.backend() == "gloo");
  REQUIRE(loaded.fits().size() == model.fits().size());
  for (const auto& [key, fit] : model.fits()) {
    INFO(collective_kind_name(key.first) << " on " << key.second);
    CHECK(loaded.fits().at(key).alpha_s == fit.alpha_s);
    CHECK(loaded.fits().at(key).beta_bytes_per_s == fit.beta_bytes_per_s);
  }
}

TEST_CASE("bad cost model files are errors naming the file and what is wrong", "[cost_model]") {
  const std::string head = R"({"format": "dtr-cost-model", "version": 1, "machine": "m", "backend": "gloo", )";
  const auto fails = [](const std::string& path, const std::string& part) {
    INFO(path);
    CHECK_THROWS_MATCHES(CostModel::load(path), ValueError, MessageContains("'" + path + "'") && MessageContains(part));
  };
  fails(write_file("not_json.json", "{ fits: "), "is not a cost model file");
  fails(write_file("other_format.json", R"({"format": "safetensors", "version": 1})"),
        "is format 'safetensors' version 1; this build reads 'dtr-cost-model' version 1");
  fails(write_file("version.json", R"({"format": "dtr-cost-model", "version": 2})"), "version 2");
  fails(write_file("no_fits.json", R"({"format": "dtr-cost-model", "version": 1, "machine": "m", "backend": "gloo"})"),
        "fits");
  fails(write_file("kind.json", head + R"("fits": [{"kind": "all_sum", "group_size": 2, "alpha_s": 1e-5,
        "beta_bytes_per_s": 1e9}]})"),
        "unknown collective kind 'all_sum'");
  fails(write_file("type.json", head + R"("fits": [{"kind": "all_reduce", "group_size": "two", "alpha_s": 1e-5,
        "beta_bytes_per_s": 1e9}]})"),
        "is not a cost model file");
  fails(write_file("alpha.json", head + R"("fits": [{"kind": "all_reduce", "group_size": 2, "alpha_s": -1e-5,
        "beta_bytes_per_s": 1e9}]})"),
        "all_reduce on 2 ranks: alpha_s = -1e-05");
  fails(write_file("beta.json", head + R"("fits": [{"kind": "all_reduce", "group_size": 2, "alpha_s": 1e-5,
        "beta_bytes_per_s": 0}]})"),
        "all_reduce on 2 ranks: beta_bytes_per_s = 0");
  fails(write_file("group.json", head + R"("fits": [{"kind": "broadcast", "group_size": 1, "alpha_s": 1e-5,
        "beta_bytes_per_s": 1e9}]})"),
        "broadcast on 1 ranks: a fit needs a group of at least 2 ranks");
  const std::string fit = R"({"kind": "all_gather", "group_size": 2, "alpha_s": 1e-5, "beta_bytes_per_s": 1e9})";
  fails(write_file("twice.json", head + R"("fits": [)" + fit + ", " + fit + "]}"),
        "all_gather on 2 ranks appears twice");
  CHECK_THROWS_MATCHES(CostModel::load("/nonexistent/cost_model.json"), OSError,
                       MessageContains("CostModel::load: opening '/nonexistent/cost_model.json'"));
}

}  // namespace
}  // namespace dtr
