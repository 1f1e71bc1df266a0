#include "kernels/cpu/copy.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/internal/convert_block.h"
#include "kernels/cpu/internal/strided_loop.h"
#include "kernels/parallel.h"

namespace dtr::cpu {
namespace {

// A transposing copy reads one operand along a dim that the other writes with a large
// stride; copying square tiles keeps both sides in L1 (row-major writes, column reads).
constexpr int64_t kTile = 32;

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
  // Threads take bands of whole tile rows.
  const int64_t tile_rows = (rows + kTile - 1) / kTile;
  const int64_t band_grain = std::max<int64_t>(1, kGrain / (kTile * cols));
  for_each_run<2>(outer, base, strides, [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
      char* out = p[0] + k * s[0];
      const char* in = p[1] + k * s[1];
      parallel_for(tile_rows, band_grain, [&](int64_t band_begin, int64_t band_end) {
        for (int64_t r0 = band_begin * kTile; r0 < std::min(rows, band_end * kTile); r0 += kTile) {
          for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
            const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
            for (int64_t r = r0; r < r1; ++r) {
              for (int64_t c = c0; c < c1; ++c) {
                *reinterpret_cast<To*>(out + r * dst_row + c * dst_col) =
                    convert<To>(*reinterpret_cast<const From*>(in + r * src_row + c * src_col));
              }
            }
          }
        }
      });
    }
  });
}

}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  std::array<char*, 2> base{static_cast<char*>(dst.data()),
                            static_cast<char*>(const_cast<void*>(src.data()))};
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
            std::memcpy(p[0], p[1], static_cast<size_t>(n) * sizeof(To));
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
      parallel_for(dst.numel(), kGrain, [&](int64_t begin, int64_t end) {
        for_each_run<2>(dst.shape(), base, strides, begin, end, run);
      });
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
    parallel_for(dst.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for_each_run<1>(dst.shape(), base, strides, begin, end, run);
    });
  });
}

}  // namespace dtr::cpu
