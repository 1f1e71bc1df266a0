#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <numeric>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/internal/gemm_kernels.h"

namespace dtr::cpu {
namespace {

using internal::GemmKernels;
using internal::TileEpilogue;

static_assert(kGemmKc == internal::kKcF32 && kGemmKcBf16 == internal::kKcBf16);

const GemmKernels& f32_kernels(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return internal::kGemmScalarF32;
    case CpuIsa::kAvx2: return internal::kGemmAvx2F32;
    case CpuIsa::kAvx512:
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kAmx: return internal::kGemmAvx512F32;
  }
  DTR_INTERNAL_ASSERT(false, "unknown CpuIsa {}", static_cast<int>(isa));
}

const GemmKernels& bf16_kernels(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return internal::kGemmScalarBf16;
    case CpuIsa::kAvx2: return internal::kGemmAvx2Bf16;
    case CpuIsa::kAvx512: return internal::kGemmAvx512Bf16;
    case CpuIsa::kAvx512Bf16: return internal::kGemmAvx512DotBf16;
    case CpuIsa::kAmx: return internal::kGemmAmxBf16;
  }
  DTR_INTERNAL_ASSERT(false, "unknown CpuIsa {}", static_cast<int>(isa));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A thread's packing buffers, kept between calls (grow-only, 64-byte aligned).
class PackBuffer {
 public:
  void* get(int64_t bytes) {
    if (bytes > bytes_) {
      data_.reset(static_cast<std::byte*>(std::aligned_alloc(64, static_cast<size_t>(ceil_div(bytes, 64) * 64))));
      DTR_CHECK(data_ != nullptr, OutOfMemoryError, "gemm: cannot allocate {} bytes of packing buffer", bytes);
      bytes_ = bytes;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  int64_t bytes_ = 0;
};

// One call, its A and B as bytes (strides still count elements of elem_bytes each), one of
// each operand's strides 1.
struct Problem {
  int64_t batch, m, n, k, kc;
  GemmMatrix<const std::byte> a, b;
  int64_t elem_bytes;
  GemmMatrix<float> c;
  GemmOptions options;
};

// The part of C one task computes: batch entry bi, the N block jb, rows [i_begin, i_end).
// K blocks run outermost, so every element sums its K blocks in order (gemm.h).
void run_task(const GemmKernels& kr, const Problem& p, int64_t bi, int64_t jb, int64_t i_begin, int64_t i_end) {
  thread_local PackBuffer a_buffer, b_buffer;
  const int64_t j0 = jb * kr.nc, nb = std::min(kr.nc, p.n - j0);
  const int64_t k_blocks = std::max<int64_t>(1, ceil_div(p.k, p.kc));  // k = 0: one empty block
  const int64_t kp_max = ceil_div(std::min(p.k, p.kc), kr.k_align) * kr.k_align;
  // A row-major A packs as a copy where the table has the "rows" format (gemm_kernels.h).
  const bool a_rows = kr.pack_a_rows != nullptr && p.a.col_stride == 1 && (kr.rows_max_n == 0 || nb <= kr.rows_max_n);
  const GemmKernels::Pack pack_a = a_rows ? kr.pack_a_rows : kr.pack_a;
  const GemmKernels::Tile tile = a_rows ? kr.tile_a_rows : kr.tile;
  const int64_t a_panel_k = a_rows ? p.kc : kp_max;  // packed K per A panel row
  std::byte* pa = static_cast<std::byte*>(a_buffer.get(ceil_div(kr.mc, kr.mr) * kr.mr * a_panel_k * kr.packed_bytes));
  std::byte* pb = static_cast<std::byte*>(b_buffer.get(ceil_div(nb, kr.nr) * kr.nr * kp_max * kr.packed_bytes));
  const std::byte* a = p.a.data + bi * p.a.batch_stride * p.elem_bytes;
  const std::byte* b = p.b.data + bi * p.b.batch_stride * p.elem_bytes;
  float* c = p.c.data + bi * p.c.batch_stride;
  for (int64_t kb = 0; kb < k_blocks; ++kb) {
    const int64_t k0 = kb * p.kc, kcur = std::min(p.kc, p.k - k0);
    const int64_t kp = ceil_div(kcur, kr.k_align) * kr.k_align;
    // B's columns are the packed rows: B^T's view of the block.
    kr.pack_b(pb, b + (k0 * p.b.row_stride + j0 * p.b.col_stride) * p.elem_bytes, p.b.col_stride, p.b.row_stride, nb,
              kcur, kp);
    const TileEpilogue e{.alpha = p.options.alpha,
                         .beta = kb == 0 ? p.options.beta : 1.0f,
                         .bias = kb == k_blocks - 1 ? p.options.bias : nullptr};
    for (int64_t i0 = i_begin; i0 < i_end; i0 += kr.mc) {
      const int64_t mb = std::min(kr.mc, i_end - i0);
      pack_a(pa, a + (i0 * p.a.row_stride + k0 * p.a.col_stride) * p.elem_bytes, p.a.row_stride, p.a.col_stride, mb,
             kcur, kp);
      for (int64_t ir = 0; ir < mb; ir += kr.mr) {
        const std::byte* a_panel = pa + ir * (a_rows ? a_panel_k : kp) * kr.packed_bytes;
        float* c_row = c + (i0 + ir) * p.c.row_stride + j0;
        for (int64_t jr = 0; jr < nb; jr += kr.nr) {
          TileEpilogue tile_e = e;
          if (e.bias != nullptr) tile_e.bias = e.bias + j0 + jr;
          tile(kp, a_panel, pb + jr * kp * kr.packed_bytes, c_row + jr, p.c.row_stride, std::min(kr.mr, mb - ir),
               std::min(kr.nr, nb - jr), tile_e);
        }
      }
    }
  }
}

// Splits the work into tasks (batch entry x N block x M range) and runs them on the threads.
// The M ranges are whole mr panels, as many as make the task count a multiple of the thread
// count (so two threads never split three tasks 2:1) and no more.
void run(const GemmKernels& kr, const Problem& p) {
  const int64_t n_blocks = ceil_div(p.n, kr.nc);
  const int64_t m_panels = ceil_div(p.m, kr.mr);
  const int64_t outer = p.batch * n_blocks;
  const int64_t threads = num_threads();
  const int64_t m_splits = std::min(m_panels, threads / std::gcd(outer, threads));
  const int64_t panels_per_split = ceil_div(m_panels, m_splits);
  parallel_for(outer * m_splits, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t split = t % m_splits, jb = (t / m_splits) % n_blocks, bi = t / (m_splits * n_blocks);
      const int64_t i_begin = split * panels_per_split * kr.mr;
      const int64_t i_end = std::min(p.m, i_begin + panels_per_split * kr.mr);
      if (i_begin < i_end) run_task(kr, p, bi, jb, i_begin, i_end);
    }
  });
}

// x as bytes, with one of its strides 1: a dim of extent <= 1 has no meaningful stride, so it
// takes 1 when the other dim's is not.
template <class T>
GemmMatrix<const std::byte> normalized(GemmMatrix<const T> x, int64_t rows, int64_t cols, const char* name) {
  GemmMatrix<const std::byte> s{reinterpret_cast<const std::byte*>(x.data), x.row_stride, x.col_stride, x.batch_stride};
  if (s.col_stride != 1 && s.row_stride != 1) {
    if (cols <= 1) {
      s.col_stride = 1;
    } else if (rows <= 1) {
      s.row_stride = 1;
    }
  }
  DTR_INTERNAL_ASSERT(s.row_stride == 1 || s.col_stride == 1,
                      "gemm: operand {} [{}, {}] has strides ({}, {}); one must be 1", name, rows, cols, x.row_stride,
                      x.col_stride);
  return s;
}

template <class T>
void gemm_any(const GemmKernels& kr, int64_t kc, int64_t batch, int64_t m, int64_t n, int64_t k, GemmMatrix<const T> a,
              GemmMatrix<const T> b, GemmMatrix<float> c, const GemmOptions& options) {
  DTR_INTERNAL_ASSERT(c.col_stride == 1 || n <= 1, "gemm: C must be row-major (column stride {})", c.col_stride);
  DTR_INTERNAL_ASSERT(options.isa <= detected_cpu_isa(), "gemm: path {} asked for on a CPU with up to {}",
                      cpu_isa_name(options.isa), cpu_isa_name(detected_cpu_isa()));
  if (batch <= 0 || m <= 0 || n <= 0) return;
  const Problem p{.batch = batch,
                  .m = m,
                  .n = n,
                  .k = k,
                  .kc = kc,
                  .a = normalized(a, m, k, "A"),
                  .b = normalized(b, k, n, "B"),
                  .elem_bytes = sizeof(T),
                  .c = c,
                  .options = options};
  run(kr, p);
}

}  // namespace

void gemm(int64_t batch, int64_t m, int64_t n, int64_t k, GemmMatrix<const float> a, GemmMatrix<const float> b,
          GemmMatrix<float> c, const GemmOptions& options) {
  gemm_any(f32_kernels(options.isa), kGemmKc, batch, m, n, k, a, b, c, options);
}

void gemm(int64_t batch, int64_t m, int64_t n, int64_t k, GemmMatrix<const BFloat16> a, GemmMatrix<const BFloat16> b,
          GemmMatrix<float> c, const GemmOptions& options) {
  gemm_any(bf16_kernels(options.isa), kGemmKcBf16, batch, m, n, k, a, b, c, options);
}

}  // namespace dtr::cpu
