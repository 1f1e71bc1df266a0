// Exposed communication: per step and rank, how much collective time the compute thread
// waited for (exposed) and how much ran behind compute (hidden), from a Chrome trace
// (chrome_trace.h) holding step, collective and wait spans (kCommCategories, below).
//
// A collective's time is its span on the communication thread (or on the caller's thread,
// when the caller ran it inline): packing, transfer, unpacking. Its exposed part is the
// part of that span during which some thread of the rank was in a wait span (blocked on a
// collective, or running one inline): the compute thread could not go on. The rest is
// hidden. So for every collective, and summed over any set of them, exposed + hidden =
// total. Collectives in flight together (an asynchronous reduce-scatter beside the next
// all-gather) may overlap one wait: each phase and owner counts it for each of its
// collectives, but a step's exposed time is the time some of its collectives and a wait
// overlapped (the union), so it never exceeds the step; its hidden time is its total less
// that. A collective belongs to the step whose span holds its beginning; one that began
// outside every step is not counted. Collectives are grouped by phase (the issuer's
// trace::CommPhase: "forward all_gather", "backward all_gather", "reduce_scatter",
// "all_reduce"; "other <kind>" without one) and by owner (the FSDP group or DDP bucket).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/trace.h"

namespace dtr::trace {

// The category of one training step's span, which accounting splits time by (its args:
// step).
inline const Category kStepCategory = define_category("step");
// What accounting needs: steps, and collectives issued, running and waited for; cheap
// enough to record every step.
inline const Categories kCommCategories =
    bit(kStepCategory) | bit(Category::kIssue) | bit(Category::kCollective) | bit(Category::kWait);

struct CommTime {
  double total_us = 0, exposed_us = 0, hidden_us = 0;
  int64_t collectives = 0, bytes = 0;
  double bus_bytes = 0;  // bytes x bus_factor (collectives/collective_counter.h): what went through the rank
  void add(const CommTime& other);
};

struct CollectiveTiming {
  std::string kind, group, phase, owner;
  int64_t seq = 0, bytes = 0, group_size = 1;
  double begin_us = 0;
  CommTime time;  // of this one collective
};

struct StepComm {
  int rank = 0;
  int64_t step = 0;
  double begin_us = 0, step_us = 0;
  CommTime time;
  std::map<std::string, CommTime> by_phase, by_owner;
  std::vector<CollectiveTiming> collectives;  // in order of beginning
  // exposed / step time: the share of the step the compute thread spent on communication.
  double exposed_share() const { return step_us > 0 ? time.exposed_us / step_us : 0; }
  double hidden_share() const { return time.total_us > 0 ? time.hidden_us / time.total_us : 0; }
};

// Every (rank, step) of the trace that has a step span, ordered by rank then step.
std::vector<StepComm> account_communication(const nlohmann::json& trace);

nlohmann::json to_json(const StepComm& step);

}  // namespace dtr::trace
