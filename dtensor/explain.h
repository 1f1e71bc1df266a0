// The redistribute planner's explainer: a RedistributePlan, or every plan the planner weighed
// for a move, as text for people (explain_sharding, test failures, the guide). A plan reads as
// its steps (mesh dims, placements, the op and its groups) and a table of the bytes each rank
// sends and receives; with a CostModel, each collective step adds its buffer on the busiest
// rank and its predicted time, and the plan its predicted total (the model only explains: it
// never changes the planner's choice). Examples: docs/redistribute_planner.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "dtensor/redistribute_plan.h"

namespace dtr {

// The steps, their collectives and groups, and a table of bytes per rank. With a cost model,
// each collective step also shows its buffer bytes (buffer_bytes on the busiest rank) and its
// predicted time, and the plan its predicted total. With Deterministic::kYes each sum step
// also says how train --deterministic runs it (in the canonical tree over more than two
// ranks: dtensor/redistribute.cc).
enum class Deterministic : uint8_t { kNo, kYes };
std::string explain_plan(const RedistributePlan& plan, const CostModel* cost_model = nullptr,
                         Deterministic deterministic = Deterministic::kNo);

// Every alternative with its steps and bytes, which one was chosen and why; with a cost
// model, each collective step's predicted time as explain_plan shows it.
std::string explain_alternatives(const std::vector<RedistributePlan>& alternatives,
                                 const CostModel* cost_model = nullptr);

}  // namespace dtr
