// CPU kernel of matmul and bmm (kernels/matmul.h): Eigen GEMMs on row-major or transposed
// maps of the operands, written into a contiguous result. Shapes, dtypes, devices and
// aliasing have been checked by the caller; a 2-D product is a batch of one.
#pragma once

#include "kernels/tensor.h"

namespace dtr::cpu {

// out [B, M, N] (contiguous, a's dtype) = a [B, M, K] times b [B, K, N].
void bmm(const Tensor& out, const Tensor& a, const Tensor& b);

}  // namespace dtr::cpu
