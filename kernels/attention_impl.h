// AttentionImpl: which CUDA kernels kernels/attention.h runs: the tiled flash kernels (tensor
// cores for bfloat16/float16), or simple ones (a block per query or key row, its scores in
// global scratch) that tests compare them with. The CPU has one kernel and ignores it. One
// enum for the Tensor-level op and the CUDA launchers; standard headers only (nvcc compiles it).
#pragma once

#include <cstdint>

namespace dtr {

enum class AttentionImpl : uint8_t { kFused, kReference };

}  // namespace dtr
