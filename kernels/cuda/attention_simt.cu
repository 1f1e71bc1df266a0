// The SIMT family of CUDA attention kernels: the fused forward of float32 and float64 and
// the fused backward of every dtype (kernels/cuda/attention.cu picks the family).
#include "kernels/cuda/internal/attention_common.cuh"
#include "kernels/cuda/internal/block_reduce.cuh"
#include "kernels/cuda/internal/device_math.cuh"

namespace dtr::cuda::internal {
namespace {

// Copies rows [row0, row0 + rows) of a row-major [n, cols] matrix into a shared tile
// [rows][ld] converted to M, zeros for rows >= n. Every thread of the block calls it.
template <class M, class T>
__device__ inline void load_tile(M* tile, int ld, const T* src, int64_t row0, int64_t n, int rows, int cols) {
  for (int idx = threadIdx.x; idx < rows * cols; idx += blockDim.x) {
    const int r = idx / cols, c = idx % cols;
    const int64_t row = row0 + r;
    tile[r * ld + c] = row < n ? convert<M>(src[row * cols + c]) : M(0);
  }
}

// ============================================================================================
// SIMT kernels (every dtype; the fused forward of float32 and float64, the fused backward of
// all four). A block of 256 threads owns kRows rows (query rows for the forward and grad_q,
// key rows for grad_k/grad_v) and walks tiles of kRows rows of the other side. Thread t owns
// row r = t / kGroup and is part t % kGroup of its row's group of kGroup consecutive lanes:
// it computes the scores against the other tile's rows part + kGroup * u (u < kRows /
// kGroup) and accumulates head columns part + kGroup * c (c < kD / kGroup). A row's
// per-score values reach the whole group through width-kGroup shuffles, so no score tile
// is stored. Shared rows are padded by one element (E + 1, Ev + 1) against bank conflicts.
// ============================================================================================

constexpr int kSimtThreads = 256;

// 32 rows a tile in float, 16 in double (the same shared memory).
template <class M>
constexpr int simt_rows() {
  return sizeof(M) == 8 ? 16 : 32;
}
// The thread's kPer dot products of its row (row[0, n), shared) with the other tile's rows
// part + kGroup * u (tile[(part + kGroup * u) * ld + c]).
template <int kPer, int kGroup, class M>
__device__ inline void dots_with_tile(M (&out)[kPer], const M* row, const M* tile, int ld, int n, int part) {
#pragma unroll
  for (int u = 0; u < kPer; ++u) out[u] = 0;
  for (int c = 0; c < n; ++c) {
    const M x = row[c];
#pragma unroll
    for (int u = 0; u < kPer; ++u) out[u] += x * tile[(part + kGroup * u) * ld + c];
  }
}

// Forward: shared Q tile [kRows][E + 1], then one buffer [kRows][max(E, Ev) + 1] holding the
// key tile and, once the scores are taken, the value tile.
template <class T, int kD>
__global__ void __launch_bounds__(kSimtThreads)
    attention_forward_simt(T* out, stat_t<T>* lse, const T* q, const T* k, const T* v, AttentionProblem p) {
  using M = stat_t<T>;
  constexpr int kRows = simt_rows<M>(), kGroup = kSimtThreads / kRows, kPer = kRows / kGroup, kCols = kD / kGroup;
  extern __shared__ __align__(128) unsigned char smem[];
  const int e = static_cast<int>(p.e), ev = static_cast<int>(p.ev), ldq = e + 1, ldk = e + 1, ldv = ev + 1;
  M* qs = reinterpret_cast<M*>(smem);
  M* kvs = qs + kRows * ldq;
  const M scale = static_cast<M>(p.scale);
  const int r = static_cast<int>(threadIdx.x) / kGroup, part = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t tiles = (p.tq + kRows - 1) / kRows;
  for (int64_t w = blockIdx.x; w < p.batch * tiles; w += gridDim.x) {
    const int64_t b = w / tiles, i0 = (w % tiles) * kRows, i = i0 + r;
    const T* qb = q + b * p.tq * p.e;
    const T* kb = k + b * p.tk * p.e;
    const T* vb = v + b * p.tk * p.ev;
    __syncthreads();  // the previous work item has finished with the tiles
    load_tile(qs, ldq, qb, i0, p.tq, kRows, e);
    // Row i (even past tq, never stored) sees key 0, so m is finite after the first tile.
    const int64_t mine = key_end(p, i), last = key_end(p, (i0 + kRows < p.tq ? i0 + kRows : p.tq) - 1);
    M m = minus_infinity<M>(), l = 0, acc[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] = 0;
    for (int64_t j0 = 0; j0 < last; j0 += kRows) {
      __syncthreads();  // Q is loaded; the previous value tile is no longer read
      load_tile(kvs, ldk, kb, j0, p.tk, kRows, e);
      __syncthreads();
      M s[kPer];
      dots_with_tile<kPer, kGroup>(s, qs + r * ldq, kvs, ldk, e, part);
      M mx = minus_infinity<M>();
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        s[u] = j0 + part + kGroup * u < mine ? s[u] * scale : minus_infinity<M>();
        mx = max_of(mx, s[u]);
      }
      const M m_new = max_of(m, group_max<kGroup>(mx));
      const M alpha = m == minus_infinity<M>() ? M(0) : exp_of(m - m_new);
      M sum = 0;
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        s[u] = s[u] == minus_infinity<M>() ? M(0) : exp_of(s[u] - m_new);  // now the probability
        sum += s[u];
      }
      l = l * alpha + group_sum<kGroup>(sum);
      m = m_new;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] *= alpha;
      __syncthreads();  // the key tile is no longer read
      load_tile(kvs, ldv, vb, j0, p.tk, kRows, ev);
      __syncthreads();
      // acc[c] += sum_jj p[jj] v[jj][col]: p of the tile's key jj lives in lane jj % kGroup's s[jj / kGroup].
#pragma unroll
      for (int jj = 0; jj < kRows; ++jj) {
        const M pj = __shfl_sync(kFullMask, s[jj / kGroup], jj % kGroup, kGroup);
        const M* vrow = kvs + jj * ldv;
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int col = part + kGroup * c;
          if (col < ev) acc[c] += pj * vrow[col];
        }
      }
    }
    if (i < p.tq) {
      T* orow = out + (b * p.tq + i) * p.ev;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int col = part + kGroup * c;
        if (col < ev) orow[col] = convert<T>(acc[c] / l);
      }
      if (part == 0) lse[b * p.tq + i] = m + log_of(l);
    }
  }
}

// D [rows] = rowsum(grad_out * out): a warp per row, lanes striding the row, a shuffle tree.
template <class T>
__global__ void attention_delta(stat_t<T>* delta, const T* grad_out, const T* out, int64_t rows, int64_t ev) {
  using M = stat_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < rows; row += warps) {
    M sum = 0;
    for (int64_t c = lane; c < ev; c += 32) sum += convert<M>(grad_out[row * ev + c]) * convert<M>(out[row * ev + c]);
    sum = group_sum<32>(sum);
    if (lane == 0) delta[row] = sum;
  }
}

// grad_q: a block per query tile. Shared: Q [kRows][E + 1] and grad_out [kRows][Ev + 1] of
// the tile's rows, K [kRows][E + 1] and V [kRows][Ev + 1] of the current key tile.
//   dS_ij = P_ij (dO_i . v_j - D_i), P_ij = exp(q_i . k_j * scale - lse_i)
//   grad_q_i = scale * sum_j dS_ij k_j        (keys in tile order, then jj order)
template <class T, int kD>
__global__ void __launch_bounds__(kSimtThreads)
    attention_grad_q_simt(T* grad_q, const T* grad_out, const T* q, const T* k, const T* v, const stat_t<T>* lse,
                          const stat_t<T>* delta, AttentionProblem p) {
  using M = stat_t<T>;
  constexpr int kRows = simt_rows<M>(), kGroup = kSimtThreads / kRows, kPer = kRows / kGroup, kCols = kD / kGroup;
  extern __shared__ __align__(128) unsigned char smem[];
  const int e = static_cast<int>(p.e), ev = static_cast<int>(p.ev), lde = e + 1, ldv = ev + 1;
  M* qs = reinterpret_cast<M*>(smem);
  M* gs = qs + kRows * lde;
  M* ks = gs + kRows * ldv;
  M* vs = ks + kRows * lde;
  const M scale = static_cast<M>(p.scale);
  const int r = static_cast<int>(threadIdx.x) / kGroup, part = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t tiles = (p.tq + kRows - 1) / kRows;
  for (int64_t w = blockIdx.x; w < p.batch * tiles; w += gridDim.x) {
    const int64_t b = w / tiles, i0 = (w % tiles) * kRows, i = i0 + r;
    const T* kb = k + b * p.tk * p.e;
    const T* vb = v + b * p.tk * p.ev;
    __syncthreads();
    load_tile(qs, lde, q + b * p.tq * p.e, i0, p.tq, kRows, e);
    load_tile(gs, ldv, grad_out + b * p.tq * p.ev, i0, p.tq, kRows, ev);
    const bool valid = i < p.tq;
    const M lse_i = valid ? lse[b * p.tq + i] : M(0), delta_i = valid ? delta[b * p.tq + i] : M(0);
    const int64_t mine = valid ? key_end(p, i) : 0, last = key_end(p, (i0 + kRows < p.tq ? i0 + kRows : p.tq) - 1);
    M acc[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] = 0;
    for (int64_t j0 = 0; j0 < last; j0 += kRows) {
      __syncthreads();
      load_tile(ks, lde, kb, j0, p.tk, kRows, e);
      load_tile(vs, ldv, vb, j0, p.tk, kRows, ev);
      __syncthreads();
      M s[kPer], dp[kPer];
      dots_with_tile<kPer, kGroup>(s, qs + r * lde, ks, lde, e, part);
      dots_with_tile<kPer, kGroup>(dp, gs + r * ldv, vs, ldv, ev, part);
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        const M prob = j0 + part + kGroup * u < mine ? exp_of(s[u] * scale - lse_i) : M(0);
        s[u] = prob * (dp[u] - delta_i);  // now dS
      }
#pragma unroll
      for (int jj = 0; jj < kRows; ++jj) {
        const M ds = __shfl_sync(kFullMask, s[jj / kGroup], jj % kGroup, kGroup);
        const M* krow = ks + jj * lde;
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int col = part + kGroup * c;
          if (col < e) acc[c] += ds * krow[col];
        }
      }
    }
    if (valid) {
      T* row = grad_q + (b * p.tq + i) * p.e;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int col = part + kGroup * c;
        if (col < e) row[col] = convert<T>(acc[c] * scale);
      }
    }
  }
}

// grad_k and grad_v: a block per key tile, looping over the query tiles that see any of its
// keys. Shared: K [kRows][E + 1] and V [kRows][Ev + 1] of the tile's keys; Q [kRows][E + 1],
// grad_out [kRows][Ev + 1], lse and D [kRows] of the current query tile.
//   grad_v_j = sum_i P_ij dO_i,  grad_k_j = scale * sum_i dS_ij q_i  (queries in order)
template <class T, int kD>
__global__ void __launch_bounds__(kSimtThreads)
    attention_grad_kv_simt(T* grad_k, T* grad_v, const T* grad_out, const T* q, const T* k, const T* v,
                           const stat_t<T>* lse, const stat_t<T>* delta, AttentionProblem p) {
  using M = stat_t<T>;
  constexpr int kRows = simt_rows<M>(), kGroup = kSimtThreads / kRows, kPer = kRows / kGroup, kCols = kD / kGroup;
  extern __shared__ __align__(128) unsigned char smem[];
  const int e = static_cast<int>(p.e), ev = static_cast<int>(p.ev), lde = e + 1, ldv = ev + 1;
  M* ks = reinterpret_cast<M*>(smem);
  M* vs = ks + kRows * lde;
  M* qs = vs + kRows * ldv;
  M* gs = qs + kRows * lde;
  M* lse_s = gs + kRows * ldv;
  M* delta_s = lse_s + kRows;
  const M scale = static_cast<M>(p.scale);
  const int r = static_cast<int>(threadIdx.x) / kGroup, part = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t tiles = (p.tk + kRows - 1) / kRows;
  for (int64_t w = blockIdx.x; w < p.batch * tiles; w += gridDim.x) {
    const int64_t b = w / tiles, j0 = (w % tiles) * kRows, j = j0 + r;
    const T* qb = q + b * p.tq * p.e;
    const T* gb = grad_out + b * p.tq * p.ev;
    __syncthreads();
    load_tile(ks, lde, k + b * p.tk * p.e, j0, p.tk, kRows, e);
    load_tile(vs, ldv, v + b * p.tk * p.ev, j0, p.tk, kRows, ev);
    // Query i sees key j iff i >= query_begin(j); the tile's first key is seen by the most.
    const int64_t first = query_begin(p, j) < p.tq ? query_begin(p, j) : p.tq;
    const int64_t start = query_begin(p, j0) / kRows * kRows;
    M acc_k[kCols], acc_v[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc_k[c] = acc_v[c] = 0;
    for (int64_t i0 = start; i0 < p.tq; i0 += kRows) {
      __syncthreads();
      load_tile(qs, lde, qb, i0, p.tq, kRows, e);
      load_tile(gs, ldv, gb, i0, p.tq, kRows, ev);
      for (int t = threadIdx.x; t < kRows; t += blockDim.x) {
        const int64_t i = i0 + t;
        lse_s[t] = i < p.tq ? lse[b * p.tq + i] : M(0);
        delta_s[t] = i < p.tq ? delta[b * p.tq + i] : M(0);
      }
      __syncthreads();
      M s[kPer], dp[kPer];
      dots_with_tile<kPer, kGroup>(s, ks + r * lde, qs, lde, e, part);
      dots_with_tile<kPer, kGroup>(dp, vs + r * ldv, gs, ldv, ev, part);
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        const int ii = part + kGroup * u;
        const int64_t i = i0 + ii;
        const bool seen = j < p.tk && i >= first && i < p.tq;
        const M prob = seen ? exp_of(s[u] * scale - lse_s[ii]) : M(0);
        s[u] = prob;                           // P_ij
        dp[u] = prob * (dp[u] - delta_s[ii]);  // dS_ij
      }
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii) {
        const M prob = __shfl_sync(kFullMask, s[ii / kGroup], ii % kGroup, kGroup);
        const M ds = __shfl_sync(kFullMask, dp[ii / kGroup], ii % kGroup, kGroup);
        const M* qrow = qs + ii * lde;
        const M* grow = gs + ii * ldv;
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int col = part + kGroup * c;
          if (col < e) acc_k[c] += ds * qrow[col];
          if (col < ev) acc_v[c] += prob * grow[col];
        }
      }
    }
    if (j < p.tk) {
      T* krow = grad_k + (b * p.tk + j) * p.e;
      T* vrow = grad_v + (b * p.tk + j) * p.ev;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int col = part + kGroup * c;
        if (col < e) krow[col] = convert<T>(acc_k[c] * scale);
        if (col < ev) vrow[col] = convert<T>(acc_v[c]);
      }
    }
  }
}

// --- launches ---

template <class T>
void launch_forward(T* out, stat_t<T>* lse, const T* q, const T* k, const T* v, const AttentionProblem& p, int device,
                    cudaStream_t stream) {
  dispatch_head_dim(p.e, p.ev, [&](auto head_dim) {
    constexpr int kD = decltype(head_dim)::value;
    constexpr int kRows = simt_rows<stat_t<T>>();
    const size_t bytes = sizeof(stat_t<T>) * kRows * ((p.e + 1) + (std::max(p.e, p.ev) + 1));
    allow_shared_memory(attention_forward_simt<T, kD>, bytes, device);
    attention_forward_simt<T, kD>
        <<<grid_for(p.batch * ((p.tq + kRows - 1) / kRows)), kSimtThreads, bytes, stream>>>(out, lse, q, k, v, p);
  });
}

template <class T>
void launch_backward(T* grad_q, T* grad_k, T* grad_v, const T* grad_out, const T* q, const T* k, const T* v,
                     const T* out, const stat_t<T>* lse, stat_t<T>* delta, const AttentionProblem& p, int device,
                     cudaStream_t stream) {
  using M = stat_t<T>;
  const int64_t rows = p.batch * p.tq;
  attention_delta<T><<<internal::blocks_for(rows * 32), kThreads, 0, stream>>>(delta, grad_out, out, rows, p.ev);
  dispatch_head_dim(p.e, p.ev, [&](auto head_dim) {
    constexpr int kD = decltype(head_dim)::value;
    constexpr int kRows = simt_rows<M>();
    const size_t bytes = sizeof(M) * (2 * kRows * (p.e + 1) + 2 * kRows * (p.ev + 1) + 2 * kRows);
    allow_shared_memory(attention_grad_kv_simt<T, kD>, bytes, device);
    attention_grad_kv_simt<T, kD><<<grid_for(p.batch * ((p.tk + kRows - 1) / kRows)), kSimtThreads, bytes, stream>>>(
        grad_k, grad_v, grad_out, q, k, v, lse, delta, p);
    allow_shared_memory(attention_grad_q_simt<T, kD>, bytes, device);
    attention_grad_q_simt<T, kD><<<grid_for(p.batch * ((p.tq + kRows - 1) / kRows)), kSimtThreads, bytes, stream>>>(
        grad_q, grad_out, q, k, v, lse, delta, p);
  });
}

}  // namespace

void simt_attention_forward(void* out, void* lse, const void* q, const void* k, const void* v,
                            const AttentionProblem& p, DType dtype, int device, cudaStream_t stream) {
  const auto run = [&]<class T>(TypeTag<T>) {
    launch_forward<T>(static_cast<T*>(out), static_cast<stat_t<T>*>(lse), static_cast<const T*>(q),
                      static_cast<const T*>(k), static_cast<const T*>(v), p, device, stream);
  };
  switch (dtype) {
    case kFloat32: return run(TypeTag<float>{});
    case kFloat64: return run(TypeTag<double>{});
    default: throw_dtype_not_implemented("cuda attention's SIMT forward", dtype);
  }
}

void simt_attention_backward(void* grad_q, void* grad_k, void* grad_v, const void* grad_out, const void* q,
                             const void* k, const void* v, const void* out, const void* lse, void* delta,
                             const AttentionProblem& p, DType dtype, int device, cudaStream_t stream) {
  dispatch_floating(dtype, "cuda attention_backward", [&]<class T>(TypeTag<T>) {
    using M = stat_t<T>;
    launch_backward<T>(static_cast<T*>(grad_q), static_cast<T*>(grad_k), static_cast<T*>(grad_v),
                       static_cast<const T*>(grad_out), static_cast<const T*>(q), static_cast<const T*>(k),
                       static_cast<const T*>(v), static_cast<const T*>(out), static_cast<const M*>(lse),
                       static_cast<M*>(delta), p, device, stream);
  });
}

}  // namespace dtr::cuda::internal
