// Random tensors: uniform_, normal_ and bernoulli, drawn from Philox (kernels/philox.h).
//
// An element's value depends only on the seed and its row-major index in the global
// tensor, given by an optional ShardLayout (default: the tensor is the whole global
// tensor). So a rank drawing its shard gets exactly its slice of the whole draw, whatever
// the mesh, thread count or device: drawing a [8, 6] tensor whole equals drawing its
// [0:8, 2:5] block with layout {[8, 6], [0, 2]}. Values are drawn in double and rounded
// once to the tensor's dtype (so a bf16 uniform_ can round up to hi itself); lo + (hi - lo) u
// and mean + std z are fused multiply-adds (philox_affine). CPU and CUDA draw uniform_ and
// bernoulli bit for bit alike; normal_ within a few ulp of double (their log, cos and sin
// differ), so its float64 values may differ in the last bits and, rarely, a 16- or 32-bit
// value by one ulp of its dtype.
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"
#include "kernels/shard_layout.h"

namespace dtr {

// Fills t with uniform values in [lo, hi) (lo <= hi, both finite). Floating dtypes.
Tensor& uniform_(Tensor& t, double lo, double hi, uint64_t seed,
                 const std::optional<ShardLayout>& layout = std::nullopt);

// Fills t with normal values of the given mean and std (std >= 0), by Box-Muller.
Tensor& normal_(Tensor& t, double mean, double std, uint64_t seed,
                const std::optional<ShardLayout>& layout = std::nullopt);

// A new tensor of 1s (probability p in [0, 1]) and 0s. Any dtype, bool included.
Tensor bernoulli(Shape shape, double p, uint64_t seed, DType dtype = kFloat32,
                 const std::optional<ShardLayout>& layout = std::nullopt, Device device = kCPU);

}  // namespace dtr
