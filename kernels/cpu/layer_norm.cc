#include "kernels/cpu/layer_norm.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/internal/lane_fold.h"
#include "kernels/parallel.h"

namespace dtr::cpu {
namespace {

// Rows per partial sum of grad_weight and grad_bias: a function of the row count alone
// (never of the thread count), with at most 256 partials so their buffer stays small.
int64_t rows_per_block(int64_t rows) { return std::max<int64_t>(32, (rows + 255) / 256); }

}  // namespace

LayerNormOutput layer_norm(const Tensor& x, int64_t rows, int64_t n, const Tensor& weight, const Tensor& bias,
                           double eps) {
  const Tensor xc = x.contiguous();
  const Tensor wc = weight.defined() ? weight.contiguous() : weight;
  const Tensor bc = bias.defined() ? bias.contiguous() : bias;
  LayerNormOutput out;
  out.y = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), "layer_norm", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    out.mean = Tensor::empty({rows}, dtype_of<Acc>());
    out.rstd = Tensor::empty({rows}, dtype_of<Acc>());
    const T* px = xc.data_ptr<T>();
    const T* pw = wc.defined() ? wc.data_ptr<T>() : nullptr;
    const T* pb = bc.defined() ? bc.data_ptr<T>() : nullptr;
    T* py = out.y.data_ptr<T>();
    Acc* pmean = out.mean.data_ptr<Acc>();
    Acc* prstd = out.rstd.data_ptr<Acc>();
    parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = px + r * n;
        T* yr = py + r * n;
        // Two passes (mean, then squared deviations) keep the variance accurate.
        auto at = [xr](int64_t i) { return static_cast<Acc>(xr[i]); };
        const Acc mean = lane_sum<Acc>(n, at) / static_cast<Acc>(n);
        const Acc squares = lane_sum<Acc>(n, [&](int64_t i) { return (at(i) - mean) * (at(i) - mean); });
        const Acc rstd = Acc(1) / std::sqrt(squares / static_cast<Acc>(n) + static_cast<Acc>(eps));
        pmean[r] = mean;
        prstd[r] = rstd;
        for (int64_t i = 0; i < n; ++i) {
          Acc v = (static_cast<Acc>(xr[i]) - mean) * rstd;
          if (pw) v *= static_cast<Acc>(pw[i]);
          if (pb) v += static_cast<Acc>(pb[i]);
          yr[i] = convert<T>(v);
        }
      }
    });
  });
  return out;
}

LayerNormGrads layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, int64_t rows, int64_t n) {
  const Tensor gc = grad_y.contiguous();
  const Tensor xc = x.contiguous();
  const Tensor mc = mean.contiguous();
  const Tensor rc = rstd.contiguous();
  const Tensor wc = weight.defined() ? weight.contiguous() : weight;
  LayerNormGrads grads;
  grads.grad_x = Tensor::empty(x.shape(), x.dtype());
  grads.grad_weight = Tensor::empty({n}, x.dtype());
  grads.grad_bias = Tensor::empty({n}, x.dtype());
  dispatch_floating(x.dtype(), "layer_norm_backward", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const T* pg = gc.data_ptr<T>();
    const T* px = xc.data_ptr<T>();
    const Acc* pmean = mc.data_ptr<Acc>();
    const Acc* prstd = rc.data_ptr<Acc>();
    const T* pw = wc.defined() ? wc.data_ptr<T>() : nullptr;
    T* pgx = grads.grad_x.data_ptr<T>();
    // Partial sums of grad_weight and grad_bias, one pair of rows-of-n per block of rows.
    const int64_t block = rows_per_block(rows);
    const int64_t blocks = (rows + block - 1) / block;
    std::vector<Acc> partial_w(static_cast<size_t>(blocks * n), Acc(0));
    std::vector<Acc> partial_b(static_cast<size_t>(blocks * n), Acc(0));
    parallel_for(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
      for (int64_t k = block_begin; k < block_end; ++k) {
        Acc* dw = partial_w.data() + k * n;
        Acc* db = partial_b.data() + k * n;
        for (int64_t r = k * block; r < std::min(rows, (k + 1) * block); ++r) {
          const T* gr = pg + r * n;
          const T* xr = px + r * n;
          T* gxr = pgx + r * n;
          const Acc mu = pmean[r], rs = prstd[r];
          // With xhat = (x - mean) * rstd and g = grad_y * weight (both [n]):
          //   grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat))      [n]
          auto xhat = [&](int64_t i) { return (static_cast<Acc>(xr[i]) - mu) * rs; };
          auto g = [&](int64_t i) {
            return pw ? static_cast<Acc>(gr[i]) * static_cast<Acc>(pw[i]) : static_cast<Acc>(gr[i]);
          };
          for (int64_t i = 0; i < n; ++i) {
            dw[i] += static_cast<Acc>(gr[i]) * xhat(i);  // grad_weight += grad_y * xhat   [n]
            db[i] += static_cast<Acc>(gr[i]);            // grad_bias += grad_y            [n]
          }
          const Acc mean_g = lane_sum<Acc>(n, g) / static_cast<Acc>(n);
          const Acc mean_g_xhat = lane_sum<Acc>(n, [&](int64_t i) { return g(i) * xhat(i); }) / static_cast<Acc>(n);
          for (int64_t i = 0; i < n; ++i) gxr[i] = convert<T>(rs * (g(i) - mean_g - xhat(i) * mean_g_xhat));
        }
      }
    });
    // Blocks are summed in block order for every column.
    T* pdw = grads.grad_weight.data_ptr<T>();
    T* pdb = grads.grad_bias.data_ptr<T>();
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
  return grads;
}

}  // namespace dtr::cpu
