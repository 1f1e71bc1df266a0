#include "kernels/cuda/attention.h"

#include "core/cuda/cuda_check.h"
#include "kernels/cuda/internal/attention_common.cuh"

// Which family runs: kReference, the reference kernels (attention_reference.cu); kFused, the
// tensor-core forward for bfloat16 and float16 (attention_wmma.cu), the SIMT forward for
// float32 and float64 and the SIMT backward for all four (attention_simt.cu).
namespace dtr::cuda {

int64_t attention_scratch_numel(const AttentionProblem& p, AttentionImpl impl) {
  return impl == AttentionImpl::kFused ? 0 : internal::reference_attention_scratch_numel(p);
}

int64_t attention_backward_scratch_numel(const AttentionProblem& p, AttentionImpl impl) {
  if (impl == AttentionImpl::kFused) return p.batch * p.tq;  // delta
  return internal::reference_attention_backward_scratch_numel(p);
}

void attention(void* out, void* lse, const void* q, const void* k, const void* v, void* scratch,
               const AttentionProblem& p, AttentionImpl impl, DType dtype, int device, cudaStream_t stream) {
  if (p.batch * p.tq == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  if (impl == AttentionImpl::kReference) {
    internal::reference_attention_forward(out, lse, q, k, v, scratch, p, dtype, stream);
  } else if (dtype == kBFloat16 || dtype == kFloat16) {
    internal::wmma_attention_forward(out, lse, q, k, v, p, dtype, device, stream);
  } else {
    internal::simt_attention_forward(out, lse, q, k, v, p, dtype, device, stream);
  }
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void attention_backward(void* grad_q, void* grad_k, void* grad_v, const void* grad_out, const void* q, const void* k,
                        const void* v, const void* out, const void* lse, void* scratch, const AttentionProblem& p,
                        AttentionImpl impl, DType dtype, int device, cudaStream_t stream) {
  if (p.batch * p.tq == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  if (impl == AttentionImpl::kReference) {
    internal::reference_attention_backward(grad_q, grad_k, grad_v, grad_out, q, k, v, out, lse, scratch, p, dtype,
                                           stream);
  } else {
    internal::simt_attention_backward(grad_q, grad_k, grad_v, grad_out, q, k, v, out, lse, scratch, p, dtype, device,
                                      stream);
  }
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
