// CPU kernels of the random ops (kernels/random.h): each element of t, at any strides, is
// set to a Philox draw at its global index under layout (already checked by the caller).
#pragma once

#include <cstdint>

#include "kernels/shard_layout.h"
#include "kernels/tensor.h"

namespace dtr::cpu {

void uniform(const Tensor& t, double lo, double hi, uint64_t seed, const ShardLayout& layout);
void normal(const Tensor& t, double mean, double std, uint64_t seed, const ShardLayout& layout);
void bernoulli(const Tensor& t, double p, uint64_t seed, const ShardLayout& layout);

}  // namespace dtr::cpu
