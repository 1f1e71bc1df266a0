// Parameter initialisation (torch.nn.init) and the seed it draws from.
//
// Every draw takes the next seed of one process-wide sequence (manual_seed restarts it) and
// fills each element from Philox by its global index, so a parameter's values are the
// same whatever its mesh, placements and number of ranks, provided every rank builds the
// model in the same order. The functions write the parameter's local storage in place, as
// torch.nn.init does under no_grad: call them before the parameter is used in a graph.
#pragma once

#include <cstdint>
#include <string_view>

#include "dtensor/dtensor.h"

namespace dtr::nn {

// Restarts the seed sequence (torch.manual_seed).
void manual_seed(uint64_t seed);
// The next seed of the sequence.
uint64_t next_seed();
// Where the sequence stands (the seed and the draws taken), for a checkpoint to save and a
// resumed run to continue from: dropout masks then repeat exactly.
struct SeedState {
  uint64_t seed = 0;
  uint64_t draws = 0;
};
SeedState seed_state();
void set_seed_state(const SeedState& state);

void uniform_(DTensor& p, double lo = 0.0, double hi = 1.0);
void normal_(DTensor& p, double mean = 0.0, double std = 1.0);
void constant_(DTensor& p, double value);
void zeros_(DTensor& p);
void ones_(DTensor& p);
// Normal values redrawn by inverse CDF into [a, b] (PyTorch's trunc_normal_ method).
void trunc_normal_(DTensor& p, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0);

enum class FanMode : uint8_t { kFanIn, kFanOut };
// fan_in = size(1) x receptive field, fan_out = size(0) x receptive field, for 2+ dims
// (ValueError otherwise, naming the op and shape).
int64_t fan(const DTensor& p, FanMode mode, std::string_view op);
// U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out)).
void xavier_uniform_(DTensor& p, double gain = 1.0);
// U(-b, b), b = sqrt(3) * gain / sqrt(fan) with gain = sqrt(2 / (1 + a^2)) (leaky ReLU's).
void kaiming_uniform_(DTensor& p, double a = 0.0, FanMode mode = FanMode::kFanIn);

}  // namespace dtr::nn
