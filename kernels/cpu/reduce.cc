#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/cpu/copy.h"
#include "core/cpu/prefetch.h"
#include "core/cpu/strided_loop.h"
#include "kernels/cpu/internal/vec_math.h"

namespace dtr::cpu {
namespace {

// The accumulation type: float64 for float32 and float64 (a sum accurate at any length),
// float for the 16-bit floats, int64 for integers and bool.
template <class T>
using reduce_acc_t =
    std::conditional_t<std::is_floating_point_v<T>, double, std::conditional_t<std::is_integral_v<T>, int64_t, float>>;

// Partial results when a run folds into one accumulator: independent chains, and an
// inner loop long enough that g++ vectorises it rather than unrolling it (at 16 it
// unrolls, and then max/min stay scalar).
constexpr int64_t kLanes = 64;

// Rows of x folded into one row of accumulators four at a time, when x is contiguous with
// the reduced dims leading (x is [rows, cols] in memory: a Linear layer's bias gradient):
// acc[j] = combine(acc[j], combine(combine(x0[j], x1[j]), combine(x2[j], x3[j]))). A row of
// accumulators is twice x's row for float32 (float64 sums) and at 4096 columns fills L1,
// so it is touched once per four rows, not once per row (figures: docs/kernel_bench.md).
// The order depends on the shape alone.
// Returns false, doing nothing, for any other layout.
template <class T, class A, class Load, class Combine>
bool fold_leading_rows(const Tensor& acc, const Tensor& x, const Load& load, const Combine& combine) {
  const int64_t nd = x.dim();
  int64_t k = 0;  // x's dims [0, k) are reduced, [k, nd) kept
  while (k < nd && acc.size(k) == 1) ++k;
  for (int64_t d = k; d < nd; ++d) {
    if (acc.size(d) != x.size(d)) return false;
  }
  if (k == 0 || k == nd || !x.is_contiguous() || !acc.is_contiguous()) return false;
  const int64_t cols = acc.numel(), rows = x.numel() / std::max<int64_t>(cols, 1);
  A* a = acc.data_ptr<A>();
  const T* v = x.data_ptr<T>();
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    const T* r = v + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      a[j] = combine(
          a[j], combine(combine(load(r[j]), load(r[cols + j])), combine(load(r[2 * cols + j]), load(r[3 * cols + j]))));
    }
  }
  for (; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) a[j] = combine(a[j], load(v[i * cols + j]));
  }
  return true;
}

// acc[j] = combine(acc[j], load(x[i])) for every element i of x, where j is i's position
// in acc (x's shape with size 1 on the reduced dims; element type A).
template <class T, class A, class Load, class Combine>
void accumulate(const Tensor& acc, const Tensor& x, A identity, const Load& load, const Combine& combine) {
  if (fold_leading_rows<T, A>(acc, x, load, combine)) return;
  // Walk x in memory order: dims sorted by x's stride, outermost (largest) first.
  const int64_t nd = x.dim();
  std::vector<int64_t> order(nd);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return x.stride(i) > x.stride(j); });
  const std::vector<int64_t> acc_strides = broadcast_byte_strides(acc, x.shape());
  const std::vector<int64_t> x_strides = broadcast_byte_strides(x, x.shape());
  Shape shape(nd);
  std::array<std::vector<int64_t>, 2> strides{std::vector<int64_t>(nd), std::vector<int64_t>(nd)};
  for (int64_t i = 0; i < nd; ++i) {
    shape[i] = x.size(order[i]);
    strides[0][i] = acc_strides[order[i]];
    strides[1][i] = x_strides[order[i]];
  }
  const std::array<char*, 2> base{static_cast<char*>(acc.data()), static_cast<char*>(x.data())};
  for_each_run<2>(shape, base, strides, [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
    auto x_at = [&](int64_t i) { return load(*reinterpret_cast<const T*>(p[1] + i * s[1])); };
    if (s[0] != 0) {  // a row of accumulators, one per element of the run
      if (s[0] == sizeof(A) && s[1] == sizeof(T)) {
        A* a = reinterpret_cast<A*>(p[0]);
        const T* v = reinterpret_cast<const T*>(p[1]);
        for (int64_t i = 0; i < n; ++i) a[i] = combine(a[i], load(v[i]));
      } else {
        for (int64_t i = 0; i < n; ++i) {
          A& a = *reinterpret_cast<A*>(p[0] + i * s[0]);
          a = combine(a, x_at(i));
        }
      }
      return;
    }
    // The whole run folds into one accumulator.
    A part[kLanes];
    std::fill_n(part, kLanes, identity);
    int64_t i = 0;
    if (s[1] == sizeof(T)) {
      const T* v = reinterpret_cast<const T*>(p[1]);
      for (; i + kLanes <= n; i += kLanes) {
        read_ahead(v + i, kLanes * static_cast<int64_t>(sizeof(T)));
        for (int64_t j = 0; j < kLanes; ++j) part[j] = combine(part[j], load(v[i + j]));
      }
    } else {
      for (; i + kLanes <= n; i += kLanes) {
        for (int64_t j = 0; j < kLanes; ++j) part[j] = combine(part[j], x_at(i + j));
      }
    }
    for (; i < n; ++i) part[0] = combine(part[0], x_at(i));
    A& a = *reinterpret_cast<A*>(p[0]);
    for (int64_t j = 0; j < kLanes; ++j) a = combine(a, part[j]);
  });
}

// out = fold of x over the reduced dims, through an accumulator buffer of type A; with
// Divide::kByCount the result is divided by the number of elements folded (mean).
enum class Divide : uint8_t { kNo, kByCount };

template <class T, class Load, class Combine>
void fold(const Tensor& out, const Tensor& x, reduce_acc_t<T> identity, const Load& load, const Combine& combine,
          Divide divide) {
  using A = reduce_acc_t<T>;
  Tensor acc = Tensor::empty(out.shape(), dtype_of<A>());
  A* a = acc.data_ptr<A>();
  std::fill_n(a, acc.numel(), identity);
  accumulate<T>(acc, x, identity, load, combine);
  if (divide == Divide::kByCount && acc.numel() > 0) {
    const A count = static_cast<A>(x.numel() / acc.numel());  // 0 for an empty dim: mean is NaN
    for (int64_t i = 0; i < acc.numel(); ++i) a[i] /= count;
  }
  copy(out, acc);
}

template <class T>
reduce_acc_t<T> lowest() {
  using Limits = std::numeric_limits<reduce_acc_t<T>>;
  return Limits::has_infinity ? -Limits::infinity() : Limits::lowest();
}

template <class T>
reduce_acc_t<T> highest() {
  using Limits = std::numeric_limits<reduce_acc_t<T>>;
  return Limits::has_infinity ? Limits::infinity() : Limits::max();
}

// Whether v replaces best as the maximum: larger, or the first NaN.
template <class A>
bool beats(A v, A best) {
  return (v > best) | (is_nan(v) & !is_nan(best));
}

// The first index of the maximum of load(0), ..., load(n - 1), n > 0. Long runs go
// through kLanes running maxima: lane j sees k = j, j + kLanes, ..., in order, so it
// keeps the first index of its maximum, and the answer is the smallest index among the
// lanes holding the overall maximum.
template <class A, class Load>
int64_t first_argmax(int64_t n, const Load& load) {
  if (n < kLanes) {
    int64_t best = 0;
    for (int64_t k = 1; k < n; ++k) {
      if (beats(load(k), load(best))) best = k;
    }
    return best;
  }
  A value[kLanes];
  int64_t index[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) {
    value[j] = load(j);
    index[j] = j;
  }
  int64_t k = kLanes;
  for (; k + kLanes <= n; k += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const A v = load(k + j);
      const bool take = beats(v, value[j]);
      value[j] = take ? v : value[j];
      index[j] = take ? k + j : index[j];
    }
  }
  for (int64_t j = 0; k + j < n; ++j) {
    if (beats(load(k + j), value[j])) {
      value[j] = load(k + j);
      index[j] = k + j;
    }
  }
  int64_t best = 0;
  for (int64_t j = 1; j < kLanes; ++j) {
    if (beats(value[j], value[best]) || (!beats(value[best], value[j]) && index[j] < index[best])) best = j;
  }
  return index[best];
}

// argmax when dim is innermost in memory: each output scans its own run along dim.
template <class T>
void argmax_by_runs(const Tensor& out, const Tensor& x, int64_t dim) {
  using A = reduce_acc_t<T>;
  const int64_t n = x.size(dim);
  const int64_t step = x.stride(dim) * static_cast<int64_t>(sizeof(T));
  const std::array<char*, 2> base{static_cast<char*>(out.data()), static_cast<char*>(x.data())};
  const std::array<std::vector<int64_t>, 2> strides{broadcast_byte_strides(out, out.shape()),
                                                    broadcast_byte_strides(x, out.shape())};
  for_each_run<2>(out.shape(), base, strides, [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t m) {
    for (int64_t i = 0; i < m; ++i) {
      const char* first = p[1] + i * s[1];
      int64_t& index = *reinterpret_cast<int64_t*>(p[0] + i * s[0]);
      if (step == sizeof(T)) {
        const T* v = reinterpret_cast<const T*>(first);
        index = first_argmax<A>(n, [v](int64_t k) { return static_cast<A>(v[k]); });
      } else {
        index = first_argmax<A>(
            n, [first, step](int64_t k) { return static_cast<A>(*reinterpret_cast<const T*>(first + k * step)); });
      }
    }
  });
}

// argmax when dim is not innermost (e.g. dim 0 of a row-major matrix): slice by slice
// along dim, each slice updating a running (maximum, index) per output in memory order.
template <class T>
void argmax_by_slices(const Tensor& out, const Tensor& x, int64_t dim) {
  using A = reduce_acc_t<T>;
  Tensor best = Tensor::empty(out.shape(), dtype_of<A>());  // contiguous, like out
  copy(best, x.narrow(dim, 0, 1));
  std::fill_n(out.data_ptr<int64_t>(), out.numel(), 0);
  const std::vector<int64_t> best_strides = broadcast_byte_strides(best, out.shape());
  const std::vector<int64_t> out_strides = broadcast_byte_strides(out, out.shape());
  for (int64_t k = 1; k < x.size(dim); ++k) {
    const Tensor slice = x.narrow(dim, k, 1);
    const std::array<char*, 3> base{static_cast<char*>(best.data()), static_cast<char*>(out.data()),
                                    static_cast<char*>(slice.data())};
    const std::array<std::vector<int64_t>, 3> strides{best_strides, out_strides,
                                                      broadcast_byte_strides(slice, out.shape())};
    for_each_run<3>(out.shape(), base, strides, [k](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t m) {
      auto update = [k](A& b, int64_t& index, A v) {
        const bool take = beats(v, b);
        b = take ? v : b;
        index = take ? k : index;
      };
      if (s[0] == sizeof(A) && s[2] == sizeof(T)) {  // out is contiguous like best
        A* b = reinterpret_cast<A*>(p[0]);
        int64_t* index = reinterpret_cast<int64_t*>(p[1]);
        const T* v = reinterpret_cast<const T*>(p[2]);
        for (int64_t i = 0; i < m; ++i) update(b[i], index[i], static_cast<A>(v[i]));
        return;
      }
      for (int64_t i = 0; i < m; ++i) {
        update(*reinterpret_cast<A*>(p[0] + i * s[0]), *reinterpret_cast<int64_t*>(p[1] + i * s[1]),
               static_cast<A>(*reinterpret_cast<const T*>(p[2] + i * s[2])));
      }
    });
  }
}

}  // namespace

void reduce(const Tensor& out, const Tensor& x, ReduceKind op) {
  const std::string_view name = reduce_kind_name(op);
  auto plus = [](auto a, auto b) { return a + b; };
  // A NaN on either side wins, so max and min propagate NaN (`|`, not `||`: no branch
  // in the vectorised loop).
  auto larger = [](auto a, auto b) { return (b > a) | is_nan(b) ? b : a; };
  auto smaller = [](auto a, auto b) { return (b < a) | is_nan(b) ? b : a; };
  switch (op) {
    case ReduceKind::kSum:
      return dispatch_all(x.dtype(), name, [&]<class T>(TypeTag<T>) {
        fold<T>(
            out, x, 0, [](T v) { return static_cast<reduce_acc_t<T>>(v); }, plus, Divide::kNo);
      });
    case ReduceKind::kMean:
      return dispatch_floating(x.dtype(), name, [&]<class T>(TypeTag<T>) {
        fold<T>(
            out, x, 0, [](T v) { return static_cast<reduce_acc_t<T>>(v); }, plus, Divide::kByCount);
      });
    case ReduceKind::kSumOfSquares:
      return dispatch_floating(x.dtype(), name, [&]<class T>(TypeTag<T>) {
        fold<T>(
            out, x, 0,
            [](T v) {
              const auto a = static_cast<reduce_acc_t<T>>(v);
              return a * a;
            },
            plus, Divide::kNo);
      });
    case ReduceKind::kMax:
      return dispatch_all(x.dtype(), name, [&]<class T>(TypeTag<T>) {
        fold<T>(
            out, x, lowest<T>(), [](T v) { return static_cast<reduce_acc_t<T>>(v); }, larger, Divide::kNo);
      });
    case ReduceKind::kMin:
      return dispatch_all(x.dtype(), name, [&]<class T>(TypeTag<T>) {
        fold<T>(
            out, x, highest<T>(), [](T v) { return static_cast<reduce_acc_t<T>>(v); }, smaller, Divide::kNo);
      });
  }
  DTR_INTERNAL_ASSERT(false, "unknown ReduceKind {}", static_cast<int>(op));
}

void sum_rows_accumulate(const Tensor& acc, const Tensor& x) {
  dispatch_floating(x.dtype(), "sum_rows_accumulate", [&]<class T>(TypeTag<T>) {
    using A = reduce_acc_t<T>;
    accumulate<T>(
        acc.view({1, acc.numel()}), x, A(0), [](T v) { return static_cast<A>(v); },
        [](auto a, auto b) { return a + b; });
  });
}

void argmax(const Tensor& out, const Tensor& x, int64_t dim) {
  const int64_t n = x.size(dim);
  DTR_INTERNAL_ASSERT(n > 0 || out.numel() == 0, "argmax over an empty dim {} of {}", dim, describe(x));
  bool innermost = true;  // dim has the smallest stride: its values lie close together
  for (int64_t d = 0; d < x.dim(); ++d) innermost &= d == dim || x.size(d) == 1 || x.stride(d) > x.stride(dim);
  dispatch_numeric(x.dtype(), "argmax", [&]<class T>(TypeTag<T>) {
    if (innermost) {
      argmax_by_runs<T>(out, x, dim);
    } else {
      argmax_by_slices<T>(out, x, dim);
    }
  });
}

}  // namespace dtr::cpu
