// CPU kernels of the random ops (kernels/random.h): each element of t, at any strides, is
// set to the Philox draw (kernels/philox.h) at its global index under layout, which the
// caller has checked; threads split the elements without changing any value.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/shard_layout.h"

namespace dtr::cpu {

void uniform(const Tensor& t, double lo, double hi, uint64_t seed, const ShardLayout& layout);
void normal(const Tensor& t, double mean, double std, uint64_t seed, const ShardLayout& layout);
void bernoulli(const Tensor& t, double p, uint64_t seed, const ShardLayout& layout);

}  // namespace dtr::cpu
