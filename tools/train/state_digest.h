// One 64-bit digest of a run's whole training state (train --deterministic prints it and
// writes it to summary.json): two runs on different layouts hold the same bits exactly when
// their digests match.
#pragma once

#include <cstdint>

#include "nn/module.h"
#include "optim/optimizer.h"

namespace dtr::train {

// FNV-1a over every parameter (in named_parameters order: its name, then its whole tensor's
// bytes) and the optimizer's state (per parameter index: its step, then each state tensor's
// whole bytes). Collective: every rank calls it (each sharded tensor is gathered), and every
// rank gets the same value.
uint64_t state_digest(nn::Module& model, const optim::Optimizer& optimizer);

}  // namespace dtr::train
