#include "kernels/cpu/rms_norm.h"

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

// Rows per partial sum of grad_weight: a function of the row count alone (never of the
// thread count), with at most 256 partials so their buffer stays small (as layer_norm's).
int64_t rows_per_block(int64_t rows) { return std::max<int64_t>(32, (rows + 255) / 256); }

// Elements of a row per piece of rms_norm_backward's last pass, before which the next row's
// lines at the same place are asked for.
constexpr int64_t kPrefetchChunk = 256;

// rms_norm_backward's first pass over a row, with g = grad_y * weight (grad_y when
// unweighted) and xhat = x * rstd: stores g in g_out (when weighted), adds grad_y * xhat to
// the block's partial grad_weight, and returns sum(g * xhat), summed in lanes as lane_sum
// does (the same order). The restrict pointers let GCC vectorise it without alias checks.
template <bool kWeighted, class Acc>
Acc first_pass(const Acc* __restrict grad_y, const Acc* __restrict x, const Acc* __restrict w, Acc rstd, int64_t n,
               Acc* __restrict g_out, Acc* __restrict dw) {
  constexpr int kLanes = kFoldBytes / static_cast<int>(sizeof(Acc));
  Acc sum_g_xhat[kLanes];
  std::fill_n(sum_g_xhat, kLanes, Acc(0));
  auto step = [&](int64_t i, int l) {
    const Acc xhat = x[i] * rstd;
    Acc g = grad_y[i];
    if constexpr (kWeighted) {
      g *= w[i];
      g_out[i] = g;
    }
    sum_g_xhat[l] += g * xhat;
    dw[i] += grad_y[i] * xhat;
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) step(i + l, l);
  }
  for (int l = 0; i < n; ++i, ++l) step(i, l);
  return fold_lanes<Acc, kLanes>(sum_g_xhat, [](Acc a, Acc b) { return a + b; });
}

}  // namespace

void rms_norm(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight, double eps) {
  const int64_t rows = rstd.numel();
  const int64_t n = rows == 0 ? 0 : x.numel() / rows;
  const Tensor xc = x.contiguous();
  const Tensor wc = weight.defined() ? weight.contiguous() : weight;
  dispatch_floating(x.dtype(), "rms_norm", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const T* px = xc.data_ptr<T>();
    const T* pw = wc.defined() ? wc.data_ptr<T>() : nullptr;
    T* py = y.data_ptr<T>();
    Acc* prstd = rstd.data_ptr<Acc>();
    const bool streams = streams_output(static_cast<int64_t>(y.nbytes()));
    parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
      std::vector<Acc> x_buffer, y_buffer, w_buffer;
      const Acc* w = pw ? as_acc(pw, n, w_buffer) : nullptr;
      for (int64_t r = begin; r < end; ++r) {
        // The next row is asked for while this one is computed (prefetch.h).
        if (r + 1 < rows) prefetch_to_l2(px + (r + 1) * n, n * static_cast<int64_t>(sizeof(T)));
        const Acc* xr = as_acc(px + r * n, n, x_buffer);
        Acc* yr = acc_out(py + r * n, y_buffer, n, streams);
        const Acc squares = lane_sum<Acc>(n, [xr](int64_t i) { return xr[i] * xr[i]; });
        const Acc rs = Acc(1) / std::sqrt(squares / static_cast<Acc>(n) + static_cast<Acc>(eps));
        prstd[r] = rs;
        // y = x * rstd * w, one loop with weight and one without (a test inside the loop
        // would keep it from vectorising).
        if (w != nullptr) {
          for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * rs * w[i];
        } else {
          for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * rs;
        }
        store_row(yr, py + r * n, n, streams);
      }
      if (streams) stream_fence();
    });
  });
}

void rms_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_y, const Tensor& x,
                       const Tensor& rstd, const Tensor& weight) {
  const int64_t rows = rstd.numel();
  const int64_t n = grad_weight.numel();
  const Tensor gc = grad_y.contiguous();
  const Tensor xc = x.contiguous();
  const Tensor rc = rstd.contiguous();
  const Tensor wc = weight.defined() ? weight.contiguous() : weight;
  dispatch_floating(x.dtype(), "rms_norm_backward", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const T* pg = gc.data_ptr<T>();
    const T* px = xc.data_ptr<T>();
    const Acc* prstd = rc.data_ptr<Acc>();
    const T* pw = wc.defined() ? wc.data_ptr<T>() : nullptr;
    T* pgx = grad_x.data_ptr<T>();
    // Partial sums of grad_weight, one row of n per block of rows.
    const int64_t block = rows_per_block(rows);
    const int64_t blocks = (rows + block - 1) / block;
    Tensor partials = Tensor::empty({blocks, n}, dtype_of<Acc>());
    Acc* partial_w = partials.data_ptr<Acc>();
    std::fill_n(partial_w, partials.numel(), Acc(0));
    const bool streams = streams_output(static_cast<int64_t>(grad_x.nbytes()));
    parallel_for(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
      std::vector<Acc> g_buffer, x_buffer, out_buffer, w_buffer;
      const Acc* w = pw ? as_acc(pw, n, w_buffer) : nullptr;
      for (int64_t k = block_begin; k < block_end; ++k) {
        Acc* dw = partial_w + k * n;
        for (int64_t r = k * block; r < std::min(rows, (k + 1) * block); ++r) {
          const Acc* gr = as_acc(pg + r * n, n, g_buffer);
          const Acc* xr = as_acc(px + r * n, n, x_buffer);
          Acc* gxr = acc_out(pgx + r * n, out_buffer, n, streams);
          const Acc rs = prstd[r];
          // With xhat = x * rstd and g = grad_y * weight (both [n]):
          //   grad_x = rstd * (g - xhat * mean(g * xhat))      [n]
          // The first pass stages g in the output row (overwritten last).
          const Acc sum_g_xhat =
              w ? first_pass<true>(gr, xr, w, rs, n, gxr, dw) : first_pass<false>(gr, xr, w, rs, n, gxr, dw);
          const Acc* g = w ? gxr : gr;
          const Acc mean_g_xhat = sum_g_xhat / static_cast<Acc>(n);
          // The last pass works from L1; the next row's lines are asked for along it, a few
          // at a time (all at once, they overflow the queue of misses).
          const int64_t next = std::min(r + 1, rows - 1) * n;
          for (int64_t i0 = 0; i0 < n; i0 += kPrefetchChunk) {
            const int64_t i1 = std::min(n, i0 + kPrefetchChunk);
            prefetch_to_l2(pg + next + i0, (i1 - i0) * static_cast<int64_t>(sizeof(T)));
            prefetch_to_l2(px + next + i0, (i1 - i0) * static_cast<int64_t>(sizeof(T)));
            for (int64_t i = i0; i < i1; ++i) gxr[i] = rs * (g[i] - xr[i] * rs * mean_g_xhat);
          }
          store_row(gxr, pgx + r * n, n, streams);
        }
      }
      if (streams) stream_fence();
    });
    // Blocks are summed in block order for every column.
    T* pdw = grad_weight.data_ptr<T>();
    parallel_for(n, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        Acc s = 0;
        for (int64_t k = 0; k < blocks; ++k) s += partial_w[k * n + i];
        pdw[i] = convert<T>(s);
      }
    });
  });
}

}  // namespace dtr::cpu
