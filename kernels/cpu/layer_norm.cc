#include "kernels/cpu/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/prefetch.h"
#include "core/parallel.h"
#include "kernels/cpu/internal/acc_row.h"
#include "kernels/cpu/internal/lane_fold.h"
#include "kernels/cpu/internal/row_store.h"

namespace dtr::cpu {
namespace {

// Rows per partial sum of grad_weight and grad_bias: a function of the row count alone
// (never of the thread count), with at most 256 partials so their buffer stays small.
int64_t rows_per_block(int64_t rows) { return std::max<int64_t>(32, (rows + 255) / 256); }

// Elements of a row per piece of layer_norm_backward's last pass, before which the next
// row's lines at the same place are asked for.
constexpr int64_t kPrefetchChunk = 256;

// sum(g) and sum(g * xhat) over a row, from layer_norm_backward's first pass.
template <class Acc>
struct RowSums {
  Acc g, g_xhat;
};

// layer_norm_backward's first pass over a row, with g = grad_y * weight (grad_y when
// unweighted) and xhat = (x - mean) * rstd: stores g in g_out (when weighted), adds
// grad_y * xhat and grad_y to the block's partial grad_weight and grad_bias, and sums g and
// g * xhat in lanes as lane_sum does (the same order). One pass instead of four reads the
// row once (figures: docs/kernel_bench.md); the restrict pointers let GCC vectorise a loop
// with three outputs and five inputs without runtime alias checks.
template <bool kWeighted, class Acc>
RowSums<Acc> first_pass(const Acc* __restrict grad_y, const Acc* __restrict x, const Acc* __restrict w, Acc mean,
                        Acc rstd, int64_t n, Acc* __restrict g_out, Acc* __restrict dw, Acc* __restrict db) {
  constexpr int kLanes = kFoldBytes / static_cast<int>(sizeof(Acc));
  Acc sum_g[kLanes], sum_g_xhat[kLanes];
  std::fill_n(sum_g, kLanes, Acc(0));
  std::fill_n(sum_g_xhat, kLanes, Acc(0));
  auto step = [&](int64_t i, int l) {
    const Acc xhat = (x[i] - mean) * rstd;
    Acc g = grad_y[i];
    if constexpr (kWeighted) {
      g *= w[i];
      g_out[i] = g;
    }
    sum_g[l] += g;
    sum_g_xhat[l] += g * xhat;
    dw[i] += grad_y[i] * xhat;
    db[i] += grad_y[i];
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) step(i + l, l);
  }
  for (int l = 0; i < n; ++i, ++l) step(i, l);
  auto plus = [](Acc a, Acc b) { return a + b; };
  return {fold_lanes<Acc, kLanes>(sum_g, plus), fold_lanes<Acc, kLanes>(sum_g_xhat, plus)};
}

}  // namespace

void layer_norm(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                const Tensor& bias, double eps) {
  const int64_t rows = mean.numel();
  const int64_t n = rows == 0 ? 0 : x.numel() / rows;
  const Tensor xc = x.contiguous();
  const Tensor wc = weight.defined() ? weight.contiguous() : weight;
  const Tensor bc = bias.defined() ? bias.contiguous() : bias;
  dispatch_floating(x.dtype(), "layer_norm", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const T* px = xc.data_ptr<T>();
    const T* pw = wc.defined() ? wc.data_ptr<T>() : nullptr;
    const T* pb = bc.defined() ? bc.data_ptr<T>() : nullptr;
    T* py = y.data_ptr<T>();
    Acc* pmean = mean.data_ptr<Acc>();
    Acc* prstd = rstd.data_ptr<Acc>();
    const bool streams = streams_output(static_cast<int64_t>(y.nbytes()));
    parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
      std::vector<Acc> x_buffer, y_buffer, w_buffer, b_buffer;
      const Acc* w = pw ? as_acc(pw, n, w_buffer) : nullptr;
      const Acc* b = pb ? as_acc(pb, n, b_buffer) : nullptr;
      for (int64_t r = begin; r < end; ++r) {
        // The next row is asked for while this one is computed (prefetch.h).
        if (r + 1 < rows) prefetch_to_l2(px + (r + 1) * n, n * static_cast<int64_t>(sizeof(T)));
        const Acc* xr = as_acc(px + r * n, n, x_buffer);
        Acc* yr = acc_out(py + r * n, y_buffer, n, streams);
        // Two passes (mean, then squared deviations) keep the variance accurate.
        const Acc mean = lane_sum<Acc>(n, [xr](int64_t i) { return xr[i]; }) / static_cast<Acc>(n);
        const Acc squares = lane_sum<Acc>(n, [&](int64_t i) { return (xr[i] - mean) * (xr[i] - mean); });
        const Acc rstd = Acc(1) / std::sqrt(squares / static_cast<Acc>(n) + static_cast<Acc>(eps));
        pmean[r] = mean;
        prstd[r] = rstd;
        // y = (x - mean) * rstd * w + b in one loop per combination of weight and bias (a test
        // inside the loop would keep it from vectorising).
        auto normalize = [&]<bool kWeight, bool kBias>() {
          for (int64_t i = 0; i < n; ++i) {
            Acc v = (xr[i] - mean) * rstd;
            if constexpr (kWeight) v *= w[i];
            if constexpr (kBias) v += b[i];
            yr[i] = v;
          }
        };
        if (w && b) {
          normalize.template operator()<true, true>();
        } else if (w) {
          normalize.template operator()<true, false>();
        } else if (b) {
          normalize.template operator()<false, true>();
        } else {
          normalize.template operator()<false, false>();
        }
        store_row(yr, py + r * n, n, streams);
      }
      if (streams) stream_fence();
    });
  });
}

void layer_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                         const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight) {
  const int64_t rows = mean.numel();
  const int64_t n = grad_weight.numel();
  const Tensor gc = grad_y.contiguous();
  const Tensor xc = x.contiguous();
  const Tensor mc = mean.contiguous();
  const Tensor rc = rstd.contiguous();
  const Tensor wc = weight.defined() ? weight.contiguous() : weight;
  dispatch_floating(x.dtype(), "layer_norm_backward", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const T* pg = gc.data_ptr<T>();
    const T* px = xc.data_ptr<T>();
    const Acc* pmean = mc.data_ptr<Acc>();
    const Acc* prstd = rc.data_ptr<Acc>();
    const T* pw = wc.defined() ? wc.data_ptr<T>() : nullptr;
    T* pgx = grad_x.data_ptr<T>();
    // Partial sums of grad_weight and grad_bias, one pair of rows-of-n per block of rows.
    const int64_t block = rows_per_block(rows);
    const int64_t blocks = (rows + block - 1) / block;
    // Tensors, not vectors: the CPU allocator's cache serves them without page faults.
    Tensor partials = Tensor::empty({2, blocks, n}, dtype_of<Acc>());
    std::fill_n(partials.data_ptr<Acc>(), partials.numel(), Acc(0));
    Acc* partial_w = partials.data_ptr<Acc>();
    Acc* partial_b = partial_w + blocks * n;
    const bool streams = streams_output(static_cast<int64_t>(grad_x.nbytes()));
    parallel_for(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
      std::vector<Acc> g_buffer, x_buffer, out_buffer, w_buffer;
      const Acc* w = pw ? as_acc(pw, n, w_buffer) : nullptr;
      for (int64_t k = block_begin; k < block_end; ++k) {
        Acc* dw = partial_w + k * n;
        Acc* db = partial_b + k * n;
        for (int64_t r = k * block; r < std::min(rows, (k + 1) * block); ++r) {
          const Acc* gr = as_acc(pg + r * n, n, g_buffer);
          const Acc* xr = as_acc(px + r * n, n, x_buffer);
          Acc* gxr = acc_out(pgx + r * n, out_buffer, n, streams);
          const Acc mu = pmean[r], rs = prstd[r];
          // With xhat = (x - mean) * rstd and g = grad_y * weight (both [n]):
          //   grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat))      [n]
          // The first pass stages g in the output row (overwritten last).
          const RowSums<Acc> sums = w ? first_pass<true>(gr, xr, w, mu, rs, n, gxr, dw, db)
                                      : first_pass<false>(gr, xr, w, mu, rs, n, gxr, dw, db);
          const Acc* gw = w ? gxr : gr;
          auto xhat = [&](int64_t i) { return (xr[i] - mu) * rs; };
          auto g = [&](int64_t i) { return gw[i]; };
          const Acc mean_g = sums.g / static_cast<Acc>(n);
          const Acc mean_g_xhat = sums.g_xhat / static_cast<Acc>(n);
          // The last pass works from L1; the next row's lines are asked for along it, a few
          // at a time (all at once, they overflow the queue of misses).
          const int64_t next = std::min(r + 1, rows - 1) * n;
          for (int64_t i0 = 0; i0 < n; i0 += kPrefetchChunk) {
            const int64_t i1 = std::min(n, i0 + kPrefetchChunk);
            prefetch_to_l2(pg + next + i0, (i1 - i0) * static_cast<int64_t>(sizeof(T)));
            prefetch_to_l2(px + next + i0, (i1 - i0) * static_cast<int64_t>(sizeof(T)));
            for (int64_t i = i0; i < i1; ++i) gxr[i] = rs * (g(i) - mean_g - xhat(i) * mean_g_xhat);
          }
          store_row(gxr, pgx + r * n, n, streams);
        }
      }
      if (streams) stream_fence();
    });
    // Blocks are summed in block order for every column.
    T* pdw = grad_weight.data_ptr<T>();
    T* pdb = grad_bias.data_ptr<T>();
    parallel_for(n, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        Acc w = 0, b = 0;
        for (int64_t k = 0; k < blocks; ++k) {
          w += partial_w[k * n + i];
          b += partial_b[k * n + i];
        }
        pdw[i] = convert<T>(w);
        pdb[i] = convert<T>(b);
      }
    });
  });
}

}  // namespace dtr::cpu
