// Causal: whether attention lets query i see only keys j <= i (torch's is_causal), by global
// index; one enum through every layer: the CPU and CUDA attention kernels, kernels/attention.h
// and dtensor's scaled_dot_product_attention. No includes beyond the standard library: nvcc
// compiles it.
#pragma once

#include <cstdint>

namespace dtr {

enum class Causal : uint8_t { kNo, kYes };

}  // namespace dtr
