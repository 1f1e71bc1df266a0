// visualize_sharding: a table of which global indices every rank of a DTensorSpec holds
// (PyTorch's torch.distributed.tensor.debug.visualize_sharding, jax's
// visualize_array_sharding), for any number of ranks and tensor dims, Partial included.
//
// One row per rank in mesh order: rank | mesh coord | start:end per tensor dim | local
// shape | value. The value column says "partial(sum) term over mesh dim 0 (dp)" where
// the rank holds a term of a Partial, "empty" for an empty shard, "-" otherwise.
#pragma once

#include <string>

#include "dtensor/dtensor_spec.h"

namespace dtr {

// The header line (the spec) followed by the table.
std::string visualize_sharding(const DTensorSpec& spec);

}  // namespace dtr
