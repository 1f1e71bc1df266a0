#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/internal/strided_loop.h"

namespace dtr::cpu {
namespace {

// The accumulation type: float64 for float32 and float64 (a sum accurate at any length),
// float for the 16-bit floats, int64 for integers and bool.
template <class T>
using reduce_acc_t = std::conditional_t<std::is_floating_point_v<T>, double,
                                        std::conditional_t<std::is_integral_v<T>, int64_t, float>>;

// Partial results per run folded into one accumulator: independent chains the compiler vectorises.
constexpr int64_t kLanes = 16;

template <class M>
bool is_nan(M v) {
  return v != v;  // NOLINT(misc-redundant-expression): true only for NaN
}

// acc[j] = combine(acc[j], load(x[i])) for every element i of x, where j is i's position
// in acc (x's shape with size 1 on the reduced dims; element type A).
template <class T, class A, class Load, class Combine>
void accumulate(const Tensor& acc, const Tensor& x, A identity, const Load& load, const Combine& combine) {
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

}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMean: return "mean";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kSumOfSquares: return "sum_of_squares";
  }
  DTR_INTERNAL_ASSERT(false, "unknown ReduceOp {}", static_cast<int>(op));
}

void reduce(ReduceOp op, const Tensor& out, const Tensor& x) {
  const std::string_view name = reduce_op_name(op);
  auto plus = [](auto a, auto b) { return a + b; };
  // A NaN on either side wins, so max and min propagate NaN.
  auto larger = [](auto a, auto b) { return is_nan(b) || b > a ? b : a; };
  auto smaller = [](auto a, auto b) { return is_nan(b) || b < a ? b : a; };
  switch (op) {
    case ReduceOp::kSum:
      return dispatch_all(x.dtype(), name, [&]<class T>(TypeTag<T>) {
        fold<T>(out, x, 0, [](T v) { return static_cast<reduce_acc_t<T>>(v); }, plus, Divide::kNo);
      });
    case ReduceOp::kMean:
      return dispatch_floating(x.dtype(), name, [&]<class T>(TypeTag<T>) {
        fold<T>(out, x, 0, [](T v) { return static_cast<reduce_acc_t<T>>(v); }, plus, Divide::kByCount);
      });
    case ReduceOp::kSumOfSquares:
      return dispatch_floating(x.dtype(), name, [&]<class T>(TypeTag<T>) {
        fold<T>(out, x, 0, [](T v) {
          const auto a = static_cast<reduce_acc_t<T>>(v);
          return a * a;
        }, plus, Divide::kNo);
      });
    case ReduceOp::kMax:
      return dispatch_all(x.dtype(), name, [&]<class T>(TypeTag<T>) {
        fold<T>(out, x, lowest<T>(), [](T v) { return static_cast<reduce_acc_t<T>>(v); }, larger, Divide::kNo);
      });
    case ReduceOp::kMin:
      return dispatch_all(x.dtype(), name, [&]<class T>(TypeTag<T>) {
        fold<T>(out, x, highest<T>(), [](T v) { return static_cast<reduce_acc_t<T>>(v); }, smaller, Divide::kNo);
      });
  }
  DTR_INTERNAL_ASSERT(false, "unknown ReduceOp {}", static_cast<int>(op));
}

void argmax(const Tensor& out, const Tensor& x, int64_t dim) {
  const int64_t n = x.size(dim);
  DTR_INTERNAL_ASSERT(n > 0 || out.numel() == 0, "argmax over an empty dim {} of {}", dim, describe(x));
  dispatch_numeric(x.dtype(), "argmax", [&]<class T>(TypeTag<T>) {
    const int64_t step = x.stride(dim) * static_cast<int64_t>(sizeof(T));
    const std::array<char*, 2> base{static_cast<char*>(out.data()), static_cast<char*>(x.data())};
    const std::array<std::vector<int64_t>, 2> strides{broadcast_byte_strides(out, out.shape()),
                                                      broadcast_byte_strides(x, out.shape())};
    for_each_run<2>(out.shape(), base, strides, [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t m) {
      for (int64_t i = 0; i < m; ++i) {
        const char* first = p[1] + i * s[1];
        auto at = [&](int64_t k) { return static_cast<reduce_acc_t<T>>(*reinterpret_cast<const T*>(first + k * step)); };
        auto best = at(0);
        int64_t best_k = 0;
        for (int64_t k = 1; k < n && !is_nan(best); ++k) {
          const auto v = at(k);
          if (v > best || is_nan(v)) {
            best = v;
            best_k = k;
          }
        }
        *reinterpret_cast<int64_t*>(p[0] + i * s[0]) = best_k;
      }
    });
  });
}

}  // namespace dtr::cpu
