// Dropout with a mask that depends only on (seed, global element index), and its backward.
//
// y = x * mask / (1 - p), with mask = bernoulli(x.shape, 1 - p, seed, kBool, layout): element
// i is kept where the Philox draw at its global index says so (kernels/random.h), so a
// shard of a distributed tensor drops exactly the elements the whole tensor would, on any
// mesh. The mask is bool (one byte per element, like torch's native_dropout). p = 0 returns
// x itself and an all-true mask; p = 1 returns zeros and an all-false mask; p outside
// [0, 1] is a ValueError. Scaling is computed in float (double for float64).
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"
#include "kernels/shard_layout.h"

namespace dtr {

struct DropoutOutput {
  Tensor y;     // x's shape and dtype
  Tensor mask;  // x's shape, bool: true where x was kept
};

DropoutOutput dropout(const Tensor& x, double p, uint64_t seed,
                      const std::optional<ShardLayout>& layout = std::nullopt);

// grad_x = grad_y * mask / (1 - p) as a new tensor (zeros for p = 1; grad_y itself for p = 0).
Tensor dropout_backward(const Tensor& grad_y, const Tensor& mask, double p);

}  // namespace dtr
