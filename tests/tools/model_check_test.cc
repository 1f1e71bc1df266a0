// A trace's collectives against a cost model: each prediction is the model's for the
// collective's kind, group size and bytes; the error is relative to the measured time;
// kinds without a fit are counted apart.
#include <catch2/catch.hpp>

#include "tools/trace/model_check.h"

namespace dtr {
namespace {

trace::CollectiveTiming timing(const char* kind, int64_t bytes, double measured_us) {
  trace::CollectiveTiming c;
  c.kind = kind;
  c.group_size = 2;
  c.bytes = bytes;
  c.time.total_us = measured_us;
  return c;
}

TEST_CASE("predicted against measured: per collective, median and worst error", "[model_check]") {
  CostModel model("test machine", "gloo");
  model.set(CollectiveKind::kAllGather, 2, {.alpha_s = 100e-6, .beta_bytes_per_s = 1e9});
  trace::StepComm step;
  step.rank = 1;
  step.step = 3;
  step.collectives = {timing("all_gather", 1'000'000, 1100),  // predicted 1100 us: exact
                      timing("all_gather", 0, 50),            // predicted 100 us: 100% over
                      timing("all_gather", 400'000, 1000),    // predicted 500 us: 50% under
                      timing("all_to_all", 64, 10)};          // no fit
  const std::vector<trace::StepComm> steps = {step};
  const trace::ModelCheck check = trace::check_model(steps, model);
  REQUIRE(check.rows.size() == 3);
  CHECK(check.unpredicted == 1);
  CHECK(check.rows[0].predicted_us == Approx(1100));
  CHECK(check.rows[0].error == Approx(0).margin(1e-12));
  CHECK(check.rows[1].error == Approx(1.0));
  CHECK(check.rows[2].error == Approx(0.5));
  CHECK(check.error.median == Approx(0.5));
  CHECK(check.error.worst == Approx(1.0));
  const std::string table = trace::model_check_table(check);
  CHECK_THAT(table, Catch::Contains("median 50%") && Catch::Contains("worst 100%") &&
                        Catch::Contains("1 of kinds the model has no fit for"));
}

TEST_CASE("no collective the model can predict: zero error, all counted apart", "[model_check]") {
  const CostModel model("test machine", "gloo");
  trace::StepComm step;
  step.collectives = {timing("all_reduce", 8, 5)};
  const std::vector<trace::StepComm> steps = {step};
  const trace::ModelCheck check = trace::check_model(steps, model);
  CHECK(check.rows.empty());
  CHECK(check.unpredicted == 1);
  CHECK(check.error.worst == 0);
}

}  // namespace
}  // namespace dtr
