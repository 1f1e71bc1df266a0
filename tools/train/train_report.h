// What the train program prints and writes about the ranks: every rank's memory and time
// gathered on rank 0, the seed's monitoring table, and the progress line.
//
// Memory per rank is the training device's allocator's: parameters, gradients and optimizer
// state are the local bytes of the sharded tensors; activations are the rest of the peak
// (everything else alive at the highest point: saved activations, gathered parameters,
// workspaces). On a GPU the table adds the device memory at the end (allocated, and reserved:
// allocated plus the caching allocator's cache) and the host's peak.
// Communication share is the exposed communication of the steps (tools/trace/comm_accounting.h:
// collective time during which the compute thread waited), so communication hidden behind
// compute does not count; compute share is the rest; hidden share is the part of all
// collective time that ran behind compute.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/dtensor.h"
#include "optim/optimizer.h"

namespace dtr::train {

// This rank's bytes of the parameters, of their gradients (those defined), and of an
// optimizer's state (its local tensors).
double parameter_bytes(const std::vector<DTensor*>& params);
double gradient_bytes(const std::vector<DTensor*>& params);
double optimizer_state_bytes(const optim::Optimizer& opt);

struct RankFigures {
  double param_bytes = 0, grad_bytes = 0, optim_bytes = 0;
  double peak_bytes = 0;                                      // the training device's peak (the host's on CPU ranks)
  double host_peak_bytes = 0;                                 // host memory's peak
  double device_in_use_bytes = 0, device_reserved_bytes = 0;  // a GPU's, at the end; 0 on CPU ranks
  double comm_s = 0, exposed_s = 0;                           // collective time in the steps, and its exposed part
  double train_s = 0;                                         // all of the timed steps
  double tokens = 0;                                          // this rank's tokens in the timed steps
};

// A rank's activations: its peak less its parameters, gradients and optimizer state (0 at
// least), as the monitoring table and summary.json give them.
double activation_bytes(const RankFigures& figures);

// Every rank's figures, in rank order, on every rank (one all-reduce of the default group).
std::vector<RankFigures> gather_rank_figures(const RankFigures& mine);

// The seed's monitoring table, one row per rank; GPU columns when the ranks trained on GPUs.
std::string monitoring_table(const std::vector<RankFigures>& ranks);
// The figures as summary.json holds them, activation_bytes among them.
nlohmann::json to_json(const RankFigures& figures);

}  // namespace dtr::train
