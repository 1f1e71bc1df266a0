// The reference family of CUDA attention kernels (AttentionImpl::kReference): every dtype,
// forward and backward, each score by one thread, rows of scores in global scratch.
#include "kernels/cuda/internal/attention_common.cuh"
#include "kernels/cuda/internal/block_reduce.cuh"
#include "kernels/cuda/internal/device_math.cuh"

namespace dtr::cuda::internal {
namespace {

// ============================================================================================
// Reference kernels: a block of kThreads per query row (forward, grad_q) or key row (grad_k,
// grad_v), each dot product by one thread, the row's scores in `scratch` (blockIdx.x's slice).
// ============================================================================================

int reference_blocks(int64_t rows) { return static_cast<int>(std::clamp<int64_t>(rows, 1, 2048)); }

template <class M, class T>
__device__ inline M dot_of(const T* a, const T* b, int64_t n) {
  M sum = 0;
  for (int64_t c = 0; c < n; ++c) sum += convert<M>(a[c]) * convert<M>(b[c]);
  return sum;
}

template <class T>
__global__ void attention_forward_reference(T* out, stat_t<T>* lse, const T* q, const T* k, const T* v,
                                            stat_t<T>* scratch, AttentionProblem p) {
  using M = stat_t<T>;
  M* s = scratch + blockIdx.x * p.tk;
  for (int64_t row = blockIdx.x; row < p.batch * p.tq; row += gridDim.x) {
    const int64_t b = row / p.tq, end = key_end(p, row % p.tq);
    const T* kb = k + b * p.tk * p.e;
    const T* vb = v + b * p.tk * p.ev;
    M mx = minus_infinity<M>();
    for (int64_t j = threadIdx.x; j < end; j += kThreads) {
      s[j] = dot_of<M>(q + row * p.e, kb + j * p.e, p.e) * static_cast<M>(p.scale);
      mx = max_of(mx, s[j]);
    }
    mx = block_reduce<kThreads>(mx, minus_infinity<M>(), [](M a, M b) { return max_of(a, b); });
    M sum = 0;
    for (int64_t j = threadIdx.x; j < end; j += kThreads) {
      s[j] = exp_of(s[j] - mx);
      sum += s[j];
    }
    const M l = block_sum<kThreads>(sum);  // its barrier also publishes s
    for (int64_t c = threadIdx.x; c < p.ev; c += kThreads) {
      M acc = 0;
      for (int64_t j = 0; j < end; ++j) acc += s[j] * convert<M>(vb[j * p.ev + c]);
      out[row * p.ev + c] = convert<T>(acc / l);
    }
    if (threadIdx.x == 0) lse[row] = mx + log_of(l);
    __syncthreads();  // s is rewritten by the next row
  }
}

template <class T>
__global__ void attention_delta_reference(stat_t<T>* delta, const T* grad_out, const T* out, AttentionProblem p) {
  using M = stat_t<T>;
  for (int64_t row = blockIdx.x; row < p.batch * p.tq; row += gridDim.x) {
    M partial = 0;
    for (int64_t c = threadIdx.x; c < p.ev; c += kThreads) {
      partial += convert<M>(grad_out[row * p.ev + c]) * convert<M>(out[row * p.ev + c]);
    }
    const M d = block_sum<kThreads>(partial);
    if (threadIdx.x == 0) delta[row] = d;
  }
}

template <class T>
__global__ void attention_grad_q_reference(T* grad_q, const T* grad_out, const T* q, const T* k, const T* v,
                                           const stat_t<T>* lse, const stat_t<T>* delta, stat_t<T>* scratch,
                                           AttentionProblem p) {
  using M = stat_t<T>;
  M* ds = scratch + blockIdx.x * p.tk;
  for (int64_t row = blockIdx.x; row < p.batch * p.tq; row += gridDim.x) {
    const int64_t b = row / p.tq, end = key_end(p, row % p.tq);
    const T* kb = k + b * p.tk * p.e;
    const T* vb = v + b * p.tk * p.ev;
    for (int64_t j = threadIdx.x; j < end; j += kThreads) {
      const M prob = exp_of(dot_of<M>(q + row * p.e, kb + j * p.e, p.e) * static_cast<M>(p.scale) - lse[row]);
      ds[j] = prob * (dot_of<M>(grad_out + row * p.ev, vb + j * p.ev, p.ev) - delta[row]);
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < p.e; c += kThreads) {
      M acc = 0;
      for (int64_t j = 0; j < end; ++j) acc += ds[j] * convert<M>(kb[j * p.e + c]);
      grad_q[row * p.e + c] = convert<T>(acc * static_cast<M>(p.scale));
    }
    __syncthreads();
  }
}

template <class T>
__global__ void attention_grad_kv_reference(T* grad_k, T* grad_v, const T* grad_out, const T* q, const T* k, const T* v,
                                            const stat_t<T>* lse, const stat_t<T>* delta, stat_t<T>* scratch,
                                            AttentionProblem p) {
  using M = stat_t<T>;
  M* probs = scratch + blockIdx.x * 2 * p.tq;
  M* ds = probs + p.tq;
  for (int64_t key = blockIdx.x; key < p.batch * p.tk; key += gridDim.x) {
    const int64_t b = key / p.tk, begin = query_begin(p, key % p.tk);
    const T* qb = q + b * p.tq * p.e;
    const T* gb = grad_out + b * p.tq * p.ev;
    const M* lb = lse + b * p.tq;
    const M* db = delta + b * p.tq;
    for (int64_t i = begin + threadIdx.x; i < p.tq; i += kThreads) {
      probs[i] = exp_of(dot_of<M>(qb + i * p.e, k + key * p.e, p.e) * static_cast<M>(p.scale) - lb[i]);
      ds[i] = probs[i] * (dot_of<M>(gb + i * p.ev, v + key * p.ev, p.ev) - db[i]);
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < (p.e > p.ev ? p.e : p.ev); c += kThreads) {
      M acc_k = 0, acc_v = 0;
      for (int64_t i = begin; i < p.tq; ++i) {
        if (c < p.e) acc_k += ds[i] * convert<M>(qb[i * p.e + c]);
        if (c < p.ev) acc_v += probs[i] * convert<M>(gb[i * p.ev + c]);
      }
      if (c < p.e) grad_k[key * p.e + c] = convert<T>(acc_k * static_cast<M>(p.scale));
      if (c < p.ev) grad_v[key * p.ev + c] = convert<T>(acc_v);
    }
    __syncthreads();
  }
}

}  // namespace

int64_t reference_attention_scratch_numel(const AttentionProblem& p) {
  return p.batch * p.tq == 0 ? 0 : reference_blocks(p.batch * p.tq) * p.tk;
}

int64_t reference_attention_backward_scratch_numel(const AttentionProblem& p) {
  const int64_t rows = p.batch * p.tq;
  if (rows == 0) return 0;
  return rows + std::max(reference_blocks(rows) * p.tk, reference_blocks(p.batch * p.tk) * 2 * p.tq);
}

void reference_attention_forward(void* out, void* lse, const void* q, const void* k, const void* v, void* scratch,
                                 const AttentionProblem& p, DType dtype, cudaStream_t stream) {
  dispatch_floating(dtype, "cuda attention", [&]<class T>(TypeTag<T>) {
    using M = stat_t<T>;
    attention_forward_reference<T><<<reference_blocks(p.batch * p.tq), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<M*>(lse), static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), static_cast<M*>(scratch), p);
  });
}

void reference_attention_backward(void* grad_q, void* grad_k, void* grad_v, const void* grad_out, const void* q,
                                  const void* k, const void* v, const void* out, const void* lse, void* scratch,
                                  const AttentionProblem& p, DType dtype, cudaStream_t stream) {
  dispatch_floating(dtype, "cuda attention_backward", [&]<class T>(TypeTag<T>) {
    using M = stat_t<T>;
    auto *gq = static_cast<T*>(grad_q), *gk = static_cast<T*>(grad_k), *gv = static_cast<T*>(grad_v);
    const auto *go = static_cast<const T*>(grad_out), *qq = static_cast<const T*>(q), *kk = static_cast<const T*>(k),
               *vv = static_cast<const T*>(v), *o = static_cast<const T*>(out);
    const auto* l = static_cast<const M*>(lse);
    const int64_t rows = p.batch * p.tq;
    M* delta = static_cast<M*>(scratch);  // [batch * tq], then the kernels' rows of scores
    M* rest = delta + rows;
    attention_delta_reference<T><<<reference_blocks(rows), kThreads, 0, stream>>>(delta, go, o, p);
    attention_grad_q_reference<T>
        <<<reference_blocks(rows), kThreads, 0, stream>>>(gq, go, qq, kk, vv, l, delta, rest, p);
    attention_grad_kv_reference<T>
        <<<reference_blocks(p.batch * p.tk), kThreads, 0, stream>>>(gk, gv, go, qq, kk, vv, l, delta, rest, p);
  });
}

}  // namespace dtr::cuda::internal
