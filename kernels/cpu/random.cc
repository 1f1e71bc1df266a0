#include "kernels/cpu/random.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/cpu/internal/philox_batch.h"
#include "kernels/parallel.h"

namespace dtr::cpu {
namespace {

// philox_unit_double(hi, lo) as arithmetic that vectorises: the 53 bits are hi * 2^21 +
// (lo >> 11), both parts exact in a double and their sum too, so the value is the same.
[[gnu::always_inline]] inline double unit_double(uint32_t hi, uint32_t lo) {
  return (static_cast<double>(hi) * 0x1.0p21 + static_cast<double>(lo >> 11)) * 0x1.0p-53;
}

// A draw: Philox blocks -> element values. kPerBlock elements share a block (the w of
// kernels/philox.h), and values() writes the values of kPhiloxBatch blocks' elements in
// global order, each equal to its philox_* definition (the tests compare them bit for bit).
struct Uniform {
  static constexpr int kPerBlock = 2;
  double lo, scale;
  void values(const PhiloxWords& w, double* v) const {
#pragma omp simd
    for (int j = 0; j < kPhiloxBatch; ++j) {
      v[2 * j] = lo + scale * unit_double(w.w[0][j], w.w[1][j]);
      v[2 * j + 1] = lo + scale * unit_double(w.w[2][j], w.w[3][j]);
    }
  }
};

// Box-Muller once per block for its pair of elements (philox_normal computes the pair's
// radius for each of them).
struct Normal {
  static constexpr int kPerBlock = 2;
  double mean, std;
  void values(const PhiloxWords& w, double* v) const {
    for (int j = 0; j < kPhiloxBatch; ++j) {
      const double u1 = 1.0 - unit_double(w.w[0][j], w.w[1][j]);
      const double theta = 2 * std::numbers::pi * unit_double(w.w[2][j], w.w[3][j]);
      const double r = std::sqrt(-2.0 * std::log(u1));
      v[2 * j] = mean + std * (r * std::cos(theta));
      v[2 * j + 1] = mean + std * (r * std::sin(theta));
    }
  }
};

struct Bernoulli {
  static constexpr int kPerBlock = 4;
  double threshold;  // p * 2^32: a word below it draws 1
  void values(const PhiloxWords& w, double* v) const {
    for (int k = 0; k < 4; ++k) {
#pragma omp simd
      for (int j = 0; j < kPhiloxBatch; ++j) v[4 * j + k] = static_cast<double>(w.w[k][j]) < threshold ? 1.0 : 0.0;
    }
  }
};

// Sets every element of t to convert<T>(its draw at its global index). The local elements
// are split among threads in runs along the last dim, where global indices are
// consecutive; each run is drawn a batch of blocks at a time, so a value depends on its
// global index alone, never on where a run or a thread's share begins.
template <class Draw>
void fill_by_global_index(const Tensor& t, const ShardLayout& layout, std::string_view op, uint64_t seed,
                          const Draw& draw) {
  constexpr int64_t kBatchElements = int64_t{kPhiloxBatch} * Draw::kPerBlock;
  const int64_t n = t.numel();
  const int64_t nd = t.dim();
  const Shape& sizes = t.shape();
  const Shape& strides = t.strides();
  const Shape global_strides = contiguous_strides(layout.global_shape);
  int64_t global_base = 0;
  for (int64_t d = 0; d < nd; ++d) global_base += layout.offset[d] * global_strides[d];
  const int64_t row = nd == 0 ? 1 : sizes[nd - 1];
  const int64_t row_stride = nd == 0 ? 1 : strides[nd - 1];
  dispatch_all(t.dtype(), op, [&]<class T>(TypeTag<T>) {
    T* data = static_cast<T*>(t.data());
    parallel_for(n, 4096, [&](int64_t begin, int64_t end) {
      alignas(64) PhiloxWords words;
      alignas(64) double values[kBatchElements];
      for (int64_t i = begin; i < end;) {
        // Local and global positions of flat element i; the run goes to the end of its row.
        int64_t local = 0, global = global_base, rest = i, column = 0;
        for (int64_t d = nd - 1; d >= 0; --d) {
          const int64_t index = rest % sizes[d];
          rest /= sizes[d];
          local += index * strides[d];
          global += index * global_strides[d];
          if (d == nd - 1) column = index;
        }
        const int64_t run = std::min(end - i, row - column);
        T* out = data + local;
        auto block = static_cast<uint64_t>(global) / Draw::kPerBlock;
        int64_t skip = global % Draw::kPerBlock;  // elements of the first block before the run
        for (int64_t done = 0; done < run; block += kPhiloxBatch, skip = 0) {
          philox_batch(seed, block, words);
          draw.values(words, values);
          const int64_t m = std::min(run - done, kBatchElements - skip);
          for (int64_t k = 0; k < m; ++k) out[(done + k) * row_stride] = convert<T>(values[skip + k]);
          done += m;
        }
        i += run;
      }
    });
  });
}

}  // namespace

void uniform(const Tensor& t, double lo, double hi, uint64_t seed, const ShardLayout& layout) {
  fill_by_global_index(t, layout, "uniform_", seed, Uniform{lo, hi - lo});
}

void normal(const Tensor& t, double mean, double std, uint64_t seed, const ShardLayout& layout) {
  fill_by_global_index(t, layout, "normal_", seed, Normal{mean, std});
}

void bernoulli(const Tensor& t, double p, uint64_t seed, const ShardLayout& layout) {
  fill_by_global_index(t, layout, "bernoulli", seed, Bernoulli{p * 4294967296.0});
}

}  // namespace dtr::cpu
