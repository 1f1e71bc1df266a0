#include "core/cpu/copy.h"

#include <algorithm>
#include <type_traits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "core/cpu/convert_block.h"
#include "core/cpu/copy_bytes.h"
#include "core/cpu/prefetch.h"
#include "core/cpu/stream_store.h"
#include "core/cpu/strided_loop.h"
#include "core/parallel.h"

namespace dtr::cpu {
namespace {

// A transposing copy reads one operand along a dim that the other writes with a large
// stride; copying square tiles keeps both sides in L1 (row-major writes, column reads).
constexpr int64_t kTile = 32;
// The blocks of a streamed transposing copy (below): dst columns, and the bytes of its
// buffer in L2 (half this machine's L2 per core), which set how many dst rows.
constexpr int64_t kStreamCols = 128, kStreamBufferBytes = int64_t{256} << 10;

// Elements below which a copy or fill runs on one thread (a thread start costs more).
constexpr int64_t kGrain = int64_t{1} << 16;

// The dim (other than the last) along which src is unit-stride while dst is unit-stride
// only along the last dim: a transposed copy. -1 if the copy is not of that form.
int64_t transposed_dim(const Tensor& dst, const Tensor& src, const std::vector<int64_t>& src_strides) {
  const int64_t last = dst.dim() - 1;
  const auto src_unit = static_cast<int64_t>(src.itemsize());
  if (last < 1 || dst.stride(last) != 1 || dst.size(last) < kTile || src_strides[last] == src_unit) return -1;
  for (int64_t d = last - 1; d >= 0; --d) {
    if (dst.size(d) >= kTile && src_strides[d] == src_unit) return d;
  }
  return -1;
}

#if defined(__AVX__)
// The 8 x 8 block of 4-byte elements at in (rows in_stride elements apart) written
// transposed at out (rows out_stride apart), in registers: unpack pairs of rows, shuffle
// pairs of pairs, then swap 128-bit halves.
inline void transpose_8x8(const float* in, int64_t in_stride, float* out, int64_t out_stride) {
  __m256 v[8], t[8], u[8];
  for (int k = 0; k < 8; ++k) v[k] = _mm256_loadu_ps(in + k * in_stride);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(v[k], v[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(v[k], v[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
    u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xee);
    u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xee);
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(out + k * out_stride, _mm256_permute2f128_ps(u[k], u[k + 4], 0x20));
    _mm256_storeu_ps(out + (k + 4) * out_stride, _mm256_permute2f128_ps(u[k], u[k + 4], 0x31));
  }
}
#endif

// Copies the tile [r0, r1) x [c0, c1) of a transposing copy (byte strides as named).
template <class To, class From>
void copy_tile(char* out, const char* in, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t dst_row,
               int64_t dst_col, int64_t src_row, int64_t src_col) {
#if defined(__AVX__)
  // A tile of 4-byte elements in whole 8 x 8 blocks, unit-stride on both sides: register
  // transposes.
  if constexpr (std::is_same_v<To, From> && sizeof(To) == 4) {
    if ((r1 - r0) % 8 == 0 && (c1 - c0) % 8 == 0 && dst_col == 4 && src_row == 4) {
      for (int64_t c = c0; c < c1; c += 8) {
        for (int64_t r = r0; r < r1; r += 8) {
          transpose_8x8(reinterpret_cast<const float*>(in + r * src_row + c * src_col), src_col / 4,
                        reinterpret_cast<float*>(out + r * dst_row + c * dst_col), dst_row / 4);
        }
      }
      return;
    }
  }
#endif
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      *reinterpret_cast<To*>(out + r * dst_row + c * dst_col) =
          convert<To>(*reinterpret_cast<const From*>(in + r * src_row + c * src_col));
    }
  }
}

template <class To, class From>
void copy_tiles(const Tensor& dst, const Tensor& src, std::array<char*, 2> base,
                std::array<std::vector<int64_t>, 2> strides, int64_t d) {
  // Iterate all dims but d and the last as runs; inside, copy (d, last) in tiles.
  const int64_t last = dst.dim() - 1;
  const int64_t rows = dst.size(d), cols = dst.size(last);
  const int64_t dst_row = strides[0][d], src_row = strides[1][d];
  const int64_t dst_col = strides[0][last], src_col = strides[1][last];
  Shape outer = dst.shape();
  outer[d] = 1;
  outer[last] = 1;
  // src is unit-stride along d (transposed_dim), which the streamed order reads along.
  const bool stream = streams_output(static_cast<int64_t>(dst.nbytes()));
  // Threads take bands of whole tile rows.
  const int64_t tile_rows = (rows + kTile - 1) / kTile;
  const int64_t band_grain = std::max<int64_t>(1, kGrain / (kTile * cols));
  for_each_run<2>(outer, base, strides, [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
      char* out = p[0] + k * s[0];
      const char* in = p[1] + k * s[1];
      // The src rows of the next tile in the band, each in another page when src is read
      // along dst's rows: asked for before (r0, c0) is copied.
      auto prefetch_after = [&](int64_t r0, int64_t c0) {
        const int64_t width = std::min(kTile, rows - r0) * src_row;
        for (int64_t c = c0 + kTile; c < std::min(cols, c0 + 2 * kTile); ++c) {
          prefetch_to_l2(in + r0 * src_row + c * src_col, width);
        }
      };
      parallel_for(tile_rows, band_grain, [&](int64_t band_begin, int64_t band_end) {
        const int64_t r_begin = band_begin * kTile, r_end = std::min(rows, band_end * kTile);
        if (!stream) {
          for (int64_t r0 = r_begin; r0 < r_end; r0 += kTile) {
            for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
              prefetch_after(r0, c0);
              copy_tile<To, From>(out, in, r0, std::min(rows, r0 + kTile), c0, std::min(cols, c0 + kTile), dst_row,
                                  dst_col, src_row, src_col);
            }
          }
          return;
        }
        // An output beyond the caches: the band goes kStreamCols of dst's columns (src's
        // rows) at a time, stream_rows of its rows at a time. That block is transposed into a
        // buffer in L2 reading 8 src rows side by side along their length (few streams for
        // the prefetchers), then streamed out to dst in runs of kStreamCols elements (long
        // runs for the memory's pages) with no read for ownership. It reads and writes about
        // twice as fast as kTile x kTile tiles streamed from L1 (docs/kernel_bench.md).
        const int64_t buf_row = kStreamCols * static_cast<int64_t>(sizeof(To));
        const int64_t stream_rows = kStreamBufferBytes / buf_row;
        // A tensor, not new[]: the CPU allocator's cache serves it again without page faults.
        const Tensor buffer = Tensor::empty({kStreamBufferBytes / static_cast<int64_t>(sizeof(To))}, dtype_of<To>());
        char* buf = static_cast<char*>(buffer.data());
        for (int64_t c0 = 0; c0 < cols; c0 += kStreamCols) {
          const int64_t c1 = std::min(cols, c0 + kStreamCols);
          for (int64_t q0 = r_begin; q0 < r_end; q0 += stream_rows) {
            const int64_t q1 = std::min(r_end, q0 + stream_rows);
            for (int64_t g = c0; g < c1; g += 8) {
              copy_tile<To, From>(buf + (g - c0) * dst_col, in + q0 * src_row + g * src_col, 0, q1 - q0, 0,
                                  std::min<int64_t>(8, c1 - g), buf_row, dst_col, src_row, src_col);
            }
            for (int64_t r = q0; r < q1; ++r) {
              stream_store(out + r * dst_row + c0 * dst_col, buf + (r - q0) * buf_row, (c1 - c0) * dst_col);
            }
          }
        }
        stream_fence();
      });
    }
  });
}

}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  std::array<char*, 2> base{static_cast<char*>(dst.data()), static_cast<char*>(const_cast<void*>(src.data()))};
  std::array<std::vector<int64_t>, 2> strides{broadcast_byte_strides(dst, dst.shape()),
                                              broadcast_byte_strides(src, dst.shape())};
  const int64_t tiled = transposed_dim(dst, src, strides[1]);
  dispatch_all(dst.dtype(), "copy", [&]<class To>(TypeTag<To>) {
    dispatch_all(src.dtype(), "copy", [&]<class From>(TypeTag<From>) {
      if (tiled >= 0) {
        copy_tiles<To, From>(dst, src, base, strides, tiled);
        return;
      }
      auto run = [](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
        if constexpr (std::is_same_v<To, From>) {
          if (s[0] == sizeof(To) && s[1] == sizeof(From)) {
            copy_bytes(p[0], p[1], n * static_cast<int64_t>(sizeof(To)));
            return;
          }
        }
        if (s[0] == sizeof(To) && s[1] == sizeof(From)) {
          convert_block(reinterpret_cast<const From*>(p[1]), reinterpret_cast<To*>(p[0]), n);
        } else {
          for (int64_t i = 0; i < n; ++i) {
            *reinterpret_cast<To*>(p[0] + i * s[0]) = convert<To>(*reinterpret_cast<const From*>(p[1] + i * s[1]));
          }
        }
      };
      parallel_for(dst.numel(), kGrain,
                   [&](int64_t begin, int64_t end) { for_each_run<2>(dst.shape(), base, strides, begin, end, run); });
    });
  });
}

void fill(const Tensor& dst, double value) {
  std::array<char*, 1> base{static_cast<char*>(dst.data())};
  std::array<std::vector<int64_t>, 1> strides{broadcast_byte_strides(dst, dst.shape())};
  dispatch_all(dst.dtype(), "fill_", [&]<class T>(TypeTag<T>) {
    const T v = convert<T>(value);
    auto run = [v](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
      if (s[0] == sizeof(T)) {
        std::fill_n(reinterpret_cast<T*>(p[0]), n, v);
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
      }
    };
    parallel_for(dst.numel(), kGrain,
                 [&](int64_t begin, int64_t end) { for_each_run<1>(dst.shape(), base, strides, begin, end, run); });
  });
}

}  // namespace dtr::cpu
