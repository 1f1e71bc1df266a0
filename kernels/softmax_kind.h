// SoftmaxKind: how a softmax forward ends (divide by the sum, or subtract its log) and so
// which backward formula applies; one enum for kernels/softmax.h and its CPU and CUDA
// kernels. No includes beyond the standard library: nvcc compiles it.
#pragma once

#include <cstdint>

namespace dtr {

enum class SoftmaxKind : uint8_t { kSoftmax, kLogSoftmax };

}  // namespace dtr
