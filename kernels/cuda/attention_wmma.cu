// The tensor-core family of CUDA attention kernels: the fused forward of bfloat16 and float16
// (kernels/cuda/attention.cu picks the family).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "kernels/cuda/internal/attention_common.cuh"
#include "kernels/cuda/internal/block_reduce.cuh"
#include "kernels/cuda/internal/device_math.cuh"

namespace dtr::cuda::internal {
namespace {

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

}  // namespace

void wmma_attention_forward(void* out, void* lse, const void* q, const void* k, const void* v,
                            const AttentionProblem& p, DType dtype, int device, cudaStream_t stream) {
  const auto run = [&]<class T>(TypeTag<T>) {
    dispatch_head_dim(p.e, p.ev, [&](auto head_dim) {
      constexpr int kD = decltype(head_dim)::value;
      constexpr int kBq = wmma_rows<kD>();
      const size_t bytes = wmma_layout(p.e, p.ev, kBq).bytes;
      allow_shared_memory(attention_forward_wmma<T, kD>, bytes, device);
      attention_forward_wmma<T, kD><<<grid_for(p.batch * ((p.tq + kBq - 1) / kBq)), kWmmaThreads, bytes, stream>>>(
          static_cast<T*>(out), static_cast<float*>(lse), static_cast<const T*>(q), static_cast<const T*>(k),
          static_cast<const T*>(v), p);
    });
  };
  switch (dtype) {
    case kBFloat16: return run(TypeTag<BFloat16>{});
    case kFloat16: return run(TypeTag<Half>{});
    default: throw_dtype_not_implemented("cuda attention's tensor-core forward", dtype);
  }
}

}  // namespace dtr::cuda::internal
