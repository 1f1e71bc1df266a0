#include "kernels/cpu/softmax.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/internal/exp_sum.h"
#include "kernels/cpu/internal/lane_fold.h"
#include "kernels/cpu/internal/row_store.h"

namespace dtr::cpu {
namespace {

// A contiguous tensor seen as [outer, size, inner] around dim: slice (o, j) holds the
// `size` elements at o * size * inner + j + c * inner.
struct Slices {
  int64_t outer = 1, size = 1, inner = 1;
};

Slices slices_of(const Shape& shape, int64_t dim) {
  Slices s;
  if (shape.empty()) return s;  // a 0-d tensor is one slice of one element
  for (int64_t d = 0; d < dim; ++d) s.outer *= shape[d];
  s.size = shape[dim];
  for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) s.inner *= shape[d];
  return s;
}

// Calls slice(base, stride, scratch) for every slice, threads taking runs of slices.
// stride is the constant 1 when dim is innermost (the unit-stride fast path), so the
// compiler sees contiguous rows; scratch holds `size` accumulators per thread.
template <class Acc, class Slice>
void for_each_slice(const Slices& s, Slice&& slice) {
  const int64_t count = s.outer * s.inner;
  if (count == 0 || s.size == 0) return;
  parallel_for(count, std::max<int64_t>(1, 32768 / s.size), [&](int64_t begin, int64_t end) {
    std::vector<Acc> scratch(static_cast<size_t>(s.size));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t base = (i / s.inner) * s.size * s.inner + i % s.inner;
      if (s.inner == 1) {
        slice(base, std::integral_constant<int64_t, 1>{}, scratch.data());
      } else {
        slice(base, s.inner, scratch.data());
      }
    }
  });
}

}  // namespace

void softmax(const Tensor& y, const Tensor& x, int64_t dim, SoftmaxKind kind) {
  const Tensor xc = x.contiguous();
  const Slices s = slices_of(x.shape(), dim);
  dispatch_floating(x.dtype(), "softmax", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const T* px = xc.data_ptr<T>();
    T* py = y.data_ptr<T>();
    // Rows of a large output are streamed out (row_store.h).
    const bool streams = s.inner == 1 && streams_output(static_cast<int64_t>(y.nbytes()));
    const int64_t total = x.numel();
    for_each_slice<Acc>(s, [&](int64_t base, auto stride, Acc* e) {
      const T* xs = px + base;
      T* ys = py + base;
      // Contiguous rows ask for the next row while computing this one (exp_sum).
      const T* next = s.inner == 1 && base + 2 * s.size <= total ? xs + s.size : nullptr;
      const auto [max, sum] = exp_sum<Acc>(xs, s.size, stride, kind == SoftmaxKind::kSoftmax ? e : nullptr, next);
      if (kind == SoftmaxKind::kSoftmax) {
        const Acc inverse = Acc(1) / sum;  // one division per slice, a product per element
        if (streams) {
          for (int64_t c = 0; c < s.size; ++c) e[c] *= inverse;
          store_row(e, ys, s.size, streams);
          stream_fence();  // before the thread's rows are published
        } else {
          for (int64_t c = 0; c < s.size; ++c) ys[c * stride] = convert<T>(e[c] * inverse);
        }
      } else {
        const Acc log_sum = std::log(sum);
        for (int64_t c = 0; c < s.size; ++c) {
          ys[c * stride] = convert<T>(static_cast<Acc>(xs[c * stride]) - max - log_sum);
        }
      }
    });
  });
}

void softmax_backward(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, int64_t dim, SoftmaxKind kind) {
  const Tensor gc = grad_y.contiguous();
  const Tensor yc = y.contiguous();
  const Slices s = slices_of(y.shape(), dim);
  dispatch_floating(y.dtype(), "softmax_backward", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const T* pg = gc.data_ptr<T>();
    const T* py = yc.data_ptr<T>();
    T* pgx = grad_x.data_ptr<T>();
    for_each_slice<Acc>(s, [&](int64_t base, auto stride, Acc*) {
      const T* gs = pg + base;
      const T* ys = py + base;
      T* out = pgx + base;
      auto g = [&](int64_t c) { return static_cast<Acc>(gs[c * stride]); };
      if (kind == SoftmaxKind::kSoftmax) {
        // grad_x = y * (g - sum(g * y))
        const Acc sum = lane_sum<Acc>(s.size, [&](int64_t c) { return g(c) * static_cast<Acc>(ys[c * stride]); });
        for (int64_t c = 0; c < s.size; ++c) {
          out[c * stride] = convert<T>(static_cast<Acc>(ys[c * stride]) * (static_cast<Acc>(gs[c * stride]) - sum));
        }
      } else {
        // grad_x = g - exp(y) * sum(g), y = log_softmax <= 0
        const Acc sum = lane_sum<Acc>(s.size, g);
        for (int64_t c = 0; c < s.size; ++c) {
          out[c * stride] =
              convert<T>(static_cast<Acc>(gs[c * stride]) - exp_nonpositive_of(static_cast<Acc>(ys[c * stride])) * sum);
        }
      }
    });
  });
}

}  // namespace dtr::cpu
