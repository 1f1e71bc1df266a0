#include "kernels/cpu/random.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/internal/philox_batch.h"

namespace dtr::cpu {
namespace {

// A draw: Philox blocks -> element values. kPerBlock elements share a block (the w of
// kernels/philox.h); values() writes the values of the first `blocks` blocks' elements in
// global order, each by philox.h's own helpers, so that it equals its philox_* definition
// (the tests compare them bit for bit).
struct Uniform {
  static constexpr int kPerBlock = 2;
  double lo, scale;
  void values(const PhiloxWords& w, int blocks, double* v) const {
#pragma omp simd
    for (int j = 0; j < blocks; ++j) {
      v[2 * j] = philox_affine(philox_unit_double(w.w[0][j], w.w[1][j]), scale, lo);
      v[2 * j + 1] = philox_affine(philox_unit_double(w.w[2][j], w.w[3][j]), scale, lo);
    }
  }
};

// Box-Muller once per block for its pair of elements (philox_normal computes the pair for
// each of them).
struct Normal {
  static constexpr int kPerBlock = 2;
  double mean, std;
  void values(const PhiloxWords& w, int blocks, double* v) const {
    for (int j = 0; j < blocks; ++j) {
      double z0, z1;
      philox_box_muller(w.w[0][j], w.w[1][j], w.w[2][j], w.w[3][j], &z0, &z1);
      v[2 * j] = philox_affine(z0, std, mean);
      v[2 * j + 1] = philox_affine(z1, std, mean);
    }
  }
};

struct Bernoulli {
  static constexpr int kPerBlock = 4;
  double p;
  void values(const PhiloxWords& w, int blocks, double* v) const {
    for (int k = 0; k < 4; ++k) {
#pragma omp simd
      for (int j = 0; j < blocks; ++j) v[4 * j + k] = philox_word_below(w.w[k][j], p) ? 1.0 : 0.0;
    }
  }
};

// How many trailing dims of t are walked as one run: the last, and each dim before it as
// long as the dims after it are whole (local size = global size, so global indices go on
// consecutively) and t's strides go on with one step (a shard of whole rows is one run).
int64_t run_dims(const Tensor& t, const ShardLayout& layout) {
  const int64_t nd = t.dim();
  int64_t k = 1;
  while (k < nd) {
    const int64_t inner = nd - k;  // the outermost dim merged so far
    if (t.size(inner) != layout.global_shape[inner] || t.stride(inner - 1) != t.stride(inner) * t.size(inner)) break;
    ++k;
  }
  return k;
}

// Sets every element of t to convert<T>(its draw at its global index). The local elements
// are split among threads in runs where global indices are consecutive (run_dims); each
// run is drawn a batch of blocks at a time, so a value depends on its global index alone,
// never on where a run or a thread's share begins.
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
  const int64_t merged = nd == 0 ? 0 : run_dims(t, layout);
  int64_t row = 1;  // elements of a run
  for (int64_t d = nd - merged; d < nd; ++d) row *= sizes[d];
  const int64_t row_stride = nd == 0 ? 1 : strides[nd - 1];
  dispatch_all(t.dtype(), op, [&]<class T>(TypeTag<T>) {
    T* data = static_cast<T*>(t.data());
    parallel_for(n, 4096, [&](int64_t begin, int64_t end) {
      alignas(64) PhiloxWords words;
      alignas(64) double values[kBatchElements];
      for (int64_t i = begin; i < end;) {
        // Local and global positions of flat element i, and where it sits in its run.
        int64_t local = 0, global = global_base, rest = i;
        for (int64_t d = nd - 1; d >= 0; --d) {
          const int64_t index = rest % sizes[d];
          rest /= sizes[d];
          local += index * strides[d];
          global += index * global_strides[d];
        }
        const int64_t run = std::min(end - i, row - i % row);
        T* out = data + local;
        auto block = static_cast<uint64_t>(global) / Draw::kPerBlock;
        int64_t skip = global % Draw::kPerBlock;  // elements of the first block before the run
        for (int64_t done = 0; done < run; block += kPhiloxBatch, skip = 0) {
          const int64_t m = std::min(run - done, kBatchElements - skip);
          philox_batch(seed, block, words);
          draw.values(words, static_cast<int>((skip + m + Draw::kPerBlock - 1) / Draw::kPerBlock), values);
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
  fill_by_global_index(t, layout, "bernoulli", seed, Bernoulli{p});
}

}  // namespace dtr::cpu
