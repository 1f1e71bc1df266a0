#include "kernels/cuda/attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "kernels/cuda/internal/block_reduce.cuh"
#include "kernels/cuda/internal/device_math.cuh"

namespace dtr::cuda {
namespace {

using internal::block_reduce;
using internal::block_sum;
using internal::exp_of;
using internal::kMaxBlocks;
using internal::kThreads;
using internal::log_of;

constexpr unsigned kFullMask = 0xffffffffu;

// --- the problem's shape and causal rule, on host and device ---

// Query row i sees keys [0, key_end(p, i)).
__host__ __device__ inline int64_t key_end(const AttentionProblem& p, int64_t i) {
  if (p.causal == Causal::kNo) return p.tk;
  const int64_t end = p.query_offset + i + 1;
  return end < p.tk ? end : p.tk;
}

// Key j is seen by query rows [query_begin(p, j), tq).
__host__ __device__ inline int64_t query_begin(const AttentionProblem& p, int64_t j) {
  if (p.causal == Causal::kNo) return 0;
  const int64_t begin = j - p.query_offset;
  return begin < 0 ? 0 : begin < p.tq ? begin : p.tq;
}

template <class M>
__host__ __device__ inline M minus_infinity() {
  return -std::numeric_limits<M>::infinity();
}

template <class M>
__device__ inline M max_of(M a, M b) {
  return a > b ? a : b;
}

// Folds v over the kWidth consecutive lanes of its group (kWidth divides 32); every lane of
// the warp must call it, and each gets its group's result.
template <int kWidth, class M>
__device__ inline M group_max(M v) {
  for (int offset = kWidth / 2; offset > 0; offset /= 2) v = max_of(v, __shfl_xor_sync(kFullMask, v, offset, kWidth));
  return v;
}

template <int kWidth, class M>
__device__ inline M group_sum(M v) {
  for (int offset = kWidth / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset, kWidth);
  return v;
}

// The blocks a work list of `items` tiles or rows is launched on (blocks loop past the cap).
int grid_for(int64_t items) { return static_cast<int>(std::clamp<int64_t>(items, 1, kMaxBlocks)); }

// Asks for more than the default 48 KiB of dynamic shared memory where a kernel needs it.
template <class Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes, int device) {
  DTR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                 device);
}

// The head-dim bound a kernel is compiled for: 64, 128 or 256 >= max(e, ev).
template <class F>
void dispatch_head_dim(int64_t e, int64_t ev, F&& f) {
  const int64_t d = std::max(e, ev);
  if (d <= 64) {
    f(std::integral_constant<int, 64>{});
  } else if (d <= 128) {
    f(std::integral_constant<int, 128>{});
  } else {
    f(std::integral_constant<int, 256>{});
  }
}

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

template <class T>
using stat_t = opmath_t<T>;  // float for bfloat16, float16 and float32; double for float64

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

// ============================================================================================
// Tensor-core forward for bfloat16 and float16 (nvcuda::wmma, 16 x 16 x 16 tiles, float
// accumulators). A block of 4 warps owns kBq = 64 query rows (32 for kD = 256) and walks key
// tiles of kBk = 64. Warp w owns the 16 rows rg = w / kSplit and, for kD = 256 (kSplit = 2),
// half of the value columns (ch = w % kSplit), so that its output accumulators stay at 8
// fragments. Per key tile:
//   1. K and V tiles -> shared (16-bit, zero past tk and past e / ev up to a multiple of 16);
//   2. S = Q K^T: each warp its 16 rows x (64 / kSplit) keys, stored as float to `ss`;
//   3. online softmax by rows (kThreads / kBq threads a row): scale, mask, running max m and
//      sum l in float, P = exp(S - m) rounded to 16 bits into `ps`, the rescale factor alpha
//      of each row into `alpha_s`;
//   4. each warp multiplies its output fragments by alpha of their rows, then O += P V.
// An accumulator fragment's element-to-(row, col) mapping is unspecified by CUDA; step 4 and
// the final store need it, so each warp discovers it at the start (probe_accumulator_layout)
// instead of assuming the sm_80 layout.
// ============================================================================================

namespace wmma = nvcuda::wmma;

template <class T>
struct WmmaElement;
template <>
struct WmmaElement<BFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct WmmaElement<Half> {
  using type = __half;
};

using Accumulator = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
constexpr int kAccElements = Accumulator::num_elements;
static_assert(kAccElements * 32 == 256, "a 16 x 16 float accumulator holds each element in exactly one lane");

constexpr int kWmmaThreads = 128;  // 4 warps
constexpr int kBk = 64;            // keys a tile
constexpr int kLdS = kBk + 4;      // floats a row of `ss` (a multiple of 4, as wmma's float stores ask)
constexpr int kLdP = kBk + 8;      // 16-bit elements a row of `ps` (a multiple of 8)

template <int kD>
constexpr int wmma_split() {
  return kD == 256 ? 2 : 1;
}
template <int kD>
constexpr int wmma_rows() {
  return 64 / wmma_split<kD>();
}

// Byte offsets of the forward's shared buffers, each 128-byte aligned (wmma wants 32).
// Row strides of Q, K and V: round_up(e or ev, 16) + 8 elements (a multiple of 8, and 16
// bytes off a multiple of 128, so 16-byte row segments of 8 rows fall in distinct banks).
struct WmmaLayout {
  int ep, evp, ldq, ldk, ldv;
  size_t q, k, v, s, p, alpha, l, bytes;
};

__host__ __device__ inline size_t align128(size_t n) { return (n + 127) / 128 * 128; }

__host__ __device__ inline WmmaLayout wmma_layout(int64_t e, int64_t ev, int bq) {
  WmmaLayout w;
  w.ep = static_cast<int>((e + 15) / 16 * 16);
  w.evp = static_cast<int>((ev + 15) / 16 * 16);
  w.ldq = w.ldk = w.ep + 8;
  w.ldv = w.evp + 8;
  w.q = 0;
  w.k = align128(w.q + sizeof(uint16_t) * bq * w.ldq);
  w.v = align128(w.k + sizeof(uint16_t) * kBk * w.ldk);
  w.s = align128(w.v + sizeof(uint16_t) * kBk * w.ldv);
  w.p = align128(w.s + sizeof(float) * bq * kLdS);
  w.alpha = align128(w.p + sizeof(uint16_t) * bq * kLdP);
  w.l = align128(w.alpha + sizeof(float) * bq);
  w.bytes = align128(w.l + sizeof(float) * bq);
  return w;
}

// Rows [row0, row0 + rows) of a row-major [n, cols] matrix of 16-bit values into a shared
// tile [rows][ld], as bits; zeros for rows >= n and for columns [cols, padded).
__device__ inline void load_tile_bits(uint16_t* tile, int ld, const uint16_t* src, int64_t row0, int64_t n, int rows,
                                      int cols, int padded) {
  for (int idx = threadIdx.x; idx < rows * padded; idx += blockDim.x) {
    const int r = idx / padded, c = idx % padded;
    const int64_t row = row0 + r;
    tile[r * ld + c] = row < n && c < cols ? src[row * cols + c] : uint16_t{0};
  }
}

// Where each element of an accumulator fragment sits: pos[t] = 16 * row + col of element
// x[t] in the 16 x 16 tile, for this lane. The warp stores a fragment whose element t of lane
// L holds the number L * kAccElements + t, each lane reads 8 of the 256 cells and writes the
// inverse table (number -> cell) next to it, then reads back the cells of its own numbers.
// probe: 16 rows x 32 floats of shared memory owned by this warp, row stride ld (floats).
__device__ inline void probe_accumulator_layout(float* probe, int ld, int (&pos)[kAccElements]) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  Accumulator f;
#pragma unroll
  for (int t = 0; t < kAccElements; ++t) f.x[t] = static_cast<float>(lane * kAccElements + t);
  wmma::store_matrix_sync(probe, f, ld, wmma::mem_row_major);  // cells in columns [0, 16)
  __syncwarp();
  int* inverse = reinterpret_cast<int*>(probe + 16);  // columns [16, 32)
#pragma unroll
  for (int u = 0; u < 256 / 32; ++u) {
    const int cell = lane + 32 * u;
    const int number = static_cast<int>(probe[(cell / 16) * ld + cell % 16]);
    inverse[(number / 16) * ld + number % 16] = cell;
  }
  __syncwarp();
#pragma unroll
  for (int t = 0; t < kAccElements; ++t) {
    const int number = lane * kAccElements + t;
    pos[t] = inverse[(number / 16) * ld + number % 16];
  }
  __syncwarp();
}

template <class T, int kD>
__global__ void __launch_bounds__(kWmmaThreads)
    attention_forward_wmma(T* out, float* lse, const T* q, const T* k, const T* v, AttentionProblem p) {
  using W = typename WmmaElement<T>::type;
  constexpr int kSplit = wmma_split<kD>(), kBq = wmma_rows<kD>();
  constexpr int kColsPerWarp = kD / kSplit, kFrags = kColsPerWarp / 16, kKeyFrags = kBk / 16 / kSplit;
  constexpr int kRowThreads = kWmmaThreads / kBq;  // softmax threads a row: 2 or 4
  extern __shared__ __align__(128) unsigned char smem[];
  const WmmaLayout lay = wmma_layout(p.e, p.ev, kBq);
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem + lay.q);
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem + lay.k);
  uint16_t* vs = reinterpret_cast<uint16_t*>(smem + lay.v);
  float* ss = reinterpret_cast<float*>(smem + lay.s);
  uint16_t* ps = reinterpret_cast<uint16_t*>(smem + lay.p);
  float* alpha_s = reinterpret_cast<float*>(smem + lay.alpha);
  float* l_s = reinterpret_cast<float*>(smem + lay.l);
  const int e = static_cast<int>(p.e), ev = static_cast<int>(p.ev);
  const float scale = static_cast<float>(p.scale);

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int rg = warp / kSplit, ch = warp % kSplit;  // this warp's 16 rows and column part
  const int sr = static_cast<int>(threadIdx.x) / kRowThreads, sp = static_cast<int>(threadIdx.x) % kRowThreads;

  int pos[kAccElements];
  probe_accumulator_layout(ss + rg * 16 * kLdS + ch * 32, kLdS, pos);

  const int64_t tiles = (p.tq + kBq - 1) / kBq;
  for (int64_t w = blockIdx.x; w < p.batch * tiles; w += gridDim.x) {
    const int64_t b = w / tiles, i0 = (w % tiles) * kBq;
    const uint16_t* kb = reinterpret_cast<const uint16_t*>(k + b * p.tk * p.e);
    const uint16_t* vb = reinterpret_cast<const uint16_t*>(v + b * p.tk * p.ev);
    __syncthreads();  // the layout probe and the previous work item are done with shared memory
    load_tile_bits(qs, lay.ldq, reinterpret_cast<const uint16_t*>(q + b * p.tq * p.e), i0, p.tq, kBq, e, lay.ep);
    Accumulator acc[kFrags];
#pragma unroll
    for (int f = 0; f < kFrags; ++f) wmma::fill_fragment(acc[f], 0.0f);
    float m = minus_infinity<float>(), l = 0;  // of softmax row sr (every thread of the row holds them)
    const int64_t mine = key_end(p, i0 + sr), last = key_end(p, (i0 + kBq < p.tq ? i0 + kBq : p.tq) - 1);
    for (int64_t j0 = 0; j0 < last; j0 += kBk) {
      __syncthreads();  // the previous tile's P, V and alpha are no longer read
      load_tile_bits(ks, lay.ldk, kb, j0, p.tk, kBk, e, lay.ep);
      load_tile_bits(vs, lay.ldv, vb, j0, p.tk, kBk, ev, lay.evp);
      __syncthreads();
      // 2. S [16 rows x 16 keys] per fragment: Q rows (row-major a) times K^T, i.e. the key
      // tile read as a column-major b (element (e, key) at ks[key * ldk + e]).
#pragma unroll
      for (int kf = 0; kf < kKeyFrags; ++kf) {
        const int key0 = (ch * kKeyFrags + kf) * 16;
        Accumulator s;
        wmma::fill_fragment(s, 0.0f);
        for (int kk = 0; kk < lay.ep; kk += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> a;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major> kt;
          wmma::load_matrix_sync(a, reinterpret_cast<const W*>(qs + rg * 16 * lay.ldq + kk), lay.ldq);
          wmma::load_matrix_sync(kt, reinterpret_cast<const W*>(ks + key0 * lay.ldk + kk), lay.ldk);
          wmma::mma_sync(s, a, kt, s);
        }
        wmma::store_matrix_sync(ss + rg * 16 * kLdS + key0, s, kLdS, wmma::mem_row_major);
      }
      __syncthreads();
      // 3. Online softmax of row sr, its keys sp, sp + kRowThreads, ...
      float mx = minus_infinity<float>();
      for (int jj = sp; jj < kBk; jj += kRowThreads) {
        const float x = j0 + jj < mine ? ss[sr * kLdS + jj] * scale : minus_infinity<float>();
        ss[sr * kLdS + jj] = x;
        mx = max_of(mx, x);
      }
      const float m_new = max_of(m, group_max<kRowThreads>(mx));
      const float alpha = m == minus_infinity<float>() ? 0.0f : exp_of(m - m_new);
      float sum = 0;
      for (int jj = sp; jj < kBk; jj += kRowThreads) {
        const float x = ss[sr * kLdS + jj];
        const float prob = x == minus_infinity<float>() ? 0.0f : exp_of(x - m_new);
        ps[sr * kLdP + jj] = T(prob).bits;  // rounded for the product; l sums the float
        sum += prob;
      }
      l = l * alpha + group_sum<kRowThreads>(sum);
      m = m_new;
      if (sp == 0) alpha_s[sr] = alpha;
      __syncthreads();
      // 4. O = alpha O + P V over this warp's 16 rows and column part.
#pragma unroll
      for (int f = 0; f < kFrags; ++f) {
#pragma unroll
        for (int t = 0; t < kAccElements; ++t) acc[f].x[t] *= alpha_s[rg * 16 + pos[t] / 16];
      }
#pragma unroll
      for (int kk = 0; kk < kBk; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> a;
        wmma::load_matrix_sync(a, reinterpret_cast<const W*>(ps + rg * 16 * kLdP + kk), kLdP);
#pragma unroll
        for (int f = 0; f < kFrags; ++f) {
          const int col0 = ch * kColsPerWarp + f * 16;
          if (col0 >= lay.evp) continue;  // uniform across the warp
          wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::row_major> vf;
          wmma::load_matrix_sync(vf, reinterpret_cast<const W*>(vs + kk * lay.ldv + col0), lay.ldv);
          wmma::mma_sync(acc[f], a, vf, acc[f]);
        }
      }
    }
    if (sp == 0) {
      l_s[sr] = l;
      if (i0 + sr < p.tq) lse[b * p.tq + i0 + sr] = m + log_of(l);
    }
    __syncthreads();
#pragma unroll
    for (int f = 0; f < kFrags; ++f) {
      const int col0 = ch * kColsPerWarp + f * 16;
#pragma unroll
      for (int t = 0; t < kAccElements; ++t) {
        const int row = rg * 16 + pos[t] / 16, col = col0 + pos[t] % 16;
        const int64_t i = i0 + row;
        if (i < p.tq && col < ev) out[(b * p.tq + i) * p.ev + col] = T(acc[f].x[t] / l_s[row]);
      }
    }
  }
}

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

// --- launches ---

template <class T>
constexpr bool is_16_bit() {
  return std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;
}

template <class T>
void launch_forward_fused(T* out, stat_t<T>* lse, const T* q, const T* k, const T* v, const AttentionProblem& p,
                          int device, cudaStream_t stream) {
  dispatch_head_dim(p.e, p.ev, [&](auto head_dim) {
    constexpr int kD = decltype(head_dim)::value;
    if constexpr (is_16_bit<T>()) {
      constexpr int kBq = wmma_rows<kD>();
      const size_t bytes = wmma_layout(p.e, p.ev, kBq).bytes;
      allow_shared_memory(attention_forward_wmma<T, kD>, bytes, device);
      attention_forward_wmma<T, kD>
          <<<grid_for(p.batch * ((p.tq + kBq - 1) / kBq)), kWmmaThreads, bytes, stream>>>(out, lse, q, k, v, p);
    } else {
      constexpr int kRows = simt_rows<stat_t<T>>();
      const size_t bytes = sizeof(stat_t<T>) * kRows * ((p.e + 1) + (std::max(p.e, p.ev) + 1));
      allow_shared_memory(attention_forward_simt<T, kD>, bytes, device);
      attention_forward_simt<T, kD>
          <<<grid_for(p.batch * ((p.tq + kRows - 1) / kRows)), kSimtThreads, bytes, stream>>>(out, lse, q, k, v, p);
    }
  });
}

template <class T>
void launch_backward_fused(T* grad_q, T* grad_k, T* grad_v, const T* grad_out, const T* q, const T* k, const T* v,
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

int64_t attention_scratch_numel(const AttentionProblem& p, AttentionImpl impl) {
  if (impl == AttentionImpl::kFused || p.batch * p.tq == 0) return 0;
  return reference_blocks(p.batch * p.tq) * p.tk;
}

int64_t attention_backward_scratch_numel(const AttentionProblem& p, AttentionImpl impl) {
  const int64_t rows = p.batch * p.tq;
  if (rows == 0) return 0;
  if (impl == AttentionImpl::kFused) return rows;
  return rows + std::max(reference_blocks(rows) * p.tk, reference_blocks(p.batch * p.tk) * 2 * p.tq);
}

void attention(void* out, void* lse, const void* q, const void* k, const void* v, void* scratch,
               const AttentionProblem& p, AttentionImpl impl, DType dtype, int device, cudaStream_t stream) {
  if (p.batch * p.tq == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_floating(dtype, "cuda attention", [&]<class T>(TypeTag<T>) {
    using M = stat_t<T>;
    auto* o = static_cast<T*>(out);
    auto* l = static_cast<M*>(lse);
    const auto *qq = static_cast<const T*>(q), *kk = static_cast<const T*>(k), *vv = static_cast<const T*>(v);
    if (impl == AttentionImpl::kFused) {
      launch_forward_fused<T>(o, l, qq, kk, vv, p, device, stream);
    } else {
      attention_forward_reference<T>
          <<<reference_blocks(p.batch * p.tq), kThreads, 0, stream>>>(o, l, qq, kk, vv, static_cast<M*>(scratch), p);
    }
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

void attention_backward(void* grad_q, void* grad_k, void* grad_v, const void* grad_out, const void* q, const void* k,
                        const void* v, const void* out, const void* lse, void* scratch, const AttentionProblem& p,
                        AttentionImpl impl, DType dtype, int device, cudaStream_t stream) {
  if (p.batch * p.tq == 0) return;
  DTR_CUDA_CHECK(cudaSetDevice(device), device);
  dispatch_floating(dtype, "cuda attention_backward", [&]<class T>(TypeTag<T>) {
    using M = stat_t<T>;
    auto *gq = static_cast<T*>(grad_q), *gk = static_cast<T*>(grad_k), *gv = static_cast<T*>(grad_v);
    const auto *go = static_cast<const T*>(grad_out), *qq = static_cast<const T*>(q), *kk = static_cast<const T*>(k),
               *vv = static_cast<const T*>(v), *o = static_cast<const T*>(out);
    const auto* l = static_cast<const M*>(lse);
    M* delta = static_cast<M*>(scratch);  // [batch * tq], then the reference kernels' rows
    if (impl == AttentionImpl::kFused) {
      launch_backward_fused<T>(gq, gk, gv, go, qq, kk, vv, o, l, delta, p, device, stream);
    } else {
      const int64_t rows = p.batch * p.tq;
      M* rest = delta + rows;
      attention_delta_reference<T><<<reference_blocks(rows), kThreads, 0, stream>>>(delta, go, o, p);
      attention_grad_q_reference<T>
          <<<reference_blocks(rows), kThreads, 0, stream>>>(gq, go, qq, kk, vv, l, delta, rest, p);
      attention_grad_kv_reference<T>
          <<<reference_blocks(p.batch * p.tk), kThreads, 0, stream>>>(gk, gv, go, qq, kk, vv, l, delta, rest, p);
    }
  });
  DTR_CUDA_CHECK(cudaGetLastError(), device);
}

}  // namespace dtr::cuda
