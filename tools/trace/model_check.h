// Predicted against measured: every collective of a trace's steps (comm_accounting.h) next
// to what the alpha-beta cost model (collectives/cost_model.h) predicts for its kind, group
// size and bytes, and the model's relative error over them (median and worst), so users
// know how far to trust the planner's predicted times. A collective's measured time is its
// span on the communication thread: it includes waiting for a late peer, which the model
// does not predict.
#pragma once

#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "tools/trace/comm_accounting.h"

namespace dtr::trace {

struct PredictedCollective {
  const StepComm* step = nullptr;
  const CollectiveTiming* collective = nullptr;
  double predicted_us = 0;
  double error = 0;  // |predicted - measured| / measured
};

struct ModelCheck {
  std::vector<PredictedCollective> rows;  // the collectives the model has a fit for
  int64_t unpredicted = 0;                // those of kinds it has none for
  RelativeError error;                    // over rows (zero when there are none)
};

// `steps` must outlive the result (rows point into it).
ModelCheck check_model(const std::vector<StepComm>& steps, const CostModel& model);

// The rows as a table (rank, step, kind, group size, bytes, phase, owner, measured,
// predicted, error), then the error line.
std::string model_check_table(const ModelCheck& check);

}  // namespace dtr::trace
