// CUDA cross-entropy fused with log_softmax, and its backward: the CUDA half of
// kernels/cross_entropy.h.
//
// logits [n, c] contiguous, target [n] int64, label smoothing e in [0, 1]. Forward: a block
// per row takes lse with an online max and sum (as softmax does), and for e > 0 the row's
// sum of logits (a block-wide sum), and the row's loss lse - (1 - e) logits[target] -
// e mean(logits) (0 when the target is ignore_index); one block then adds the row losses
// in double in a fixed order and writes the loss (sum, or mean over the rows not ignored:
// NaN for none). A target outside [0, c) that is not ignore_index sets *bad_target (an
// int32 the caller zeroed and reads), and its row contributes nothing. Backward: grad[r, k]
// = (exp(logits[r, k] - lse_r) - (1 - e) [k == target_r] - e / c) * grad_loss * scale,
// scale 1 or 1 / (rows not ignored), zeros for ignored rows; grad_loss is read from the
// device (a double), never copied to the host. `scratch` holds n + 1 doubles. Queued on
// `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace dtr::cuda {

void cross_entropy(void* loss, void* logsumexp, int32_t* bad_target, const void* logits, const int64_t* target,
                   int64_t n, int64_t c, int64_t ignore_index, bool mean, double label_smoothing, double* scratch,
                   DType dtype, int device, cudaStream_t stream);
void cross_entropy_backward(void* grad, const void* logits, const int64_t* target, const void* logsumexp,
                            const double* grad_loss, int64_t n, int64_t c, int64_t ignore_index, bool mean,
                            double label_smoothing, double* scratch, DType dtype, int device, cudaStream_t stream);

}  // namespace dtr::cuda
