#include "kernels/cpu/index.h"
#include "core/parallel.h"

#include <omp.h>

#include "core/cpu/strided_loop.h"
#include "kernels/cpu/internal/gather_rows.h"

namespace dtr::cpu {

namespace {

// Bytes of work (index positions x itemsize) below which one thread does it all.
constexpr int64_t kParallelBytes = int64_t{1} << 18;

enum class IndexMode { kGather, kScatterAdd };

// The loop under all four ops. `a` has index's shape (out for gather, src for scatter),
// `b` is indexed along dim (x). Gather: a[e, k] = b[e, index[e, k]]; scatter-add:
// b[e, index[e, k]] += a[e, k], where e runs over the slice (every dim but dim).
template <IndexMode mode, class T, class I>
void index_loop(const Tensor& a, const Tensor& b, int64_t dim, const Tensor& index) {
  constexpr int64_t sz = sizeof(T);
  Shape slice = index.shape();
  const int64_t k_count = slice[dim];
  slice[dim] = 1;  // for_each_run drops size-1 dims
  std::array<std::vector<int64_t>, 3> strides;
  for (int64_t d = 0; d < index.dim(); ++d) {
    strides[0].push_back(a.stride(d) * sz);
    strides[1].push_back(b.stride(d) * sz);
    strides[2].push_back(index.stride(d) * static_cast<int64_t>(sizeof(I)));
  }
  const int64_t a_k = strides[0][dim], b_k = strides[1][dim], i_k = strides[2][dim];
  std::array<char*, 3> base{static_cast<char*>(a.data()), static_cast<char*>(b.data()),
                            static_cast<char*>(index.data())};
  for_each_run<3>(slice, base, strides, [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t n) {
    auto run = [&](int64_t lo, int64_t hi) {
      if (s[0] == sz && s[1] == sz && s[2] == 0) {  // one index per k for the whole run: rows
        auto b_row = [&](int64_t k) { return p[1] + *reinterpret_cast<const I*>(p[2] + k * i_k) * b_k + lo * sz; };
        if constexpr (mode == IndexMode::kGather) {
          gather_rows(p[0] + lo * sz, a_k, k_count, (hi - lo) * sz, b_row);
        } else {
          for (int64_t k = 0; k < k_count; ++k) {
            const T* av = reinterpret_cast<const T*>(p[0] + k * a_k) + lo;
            T* bv = reinterpret_cast<T*>(b_row(k));
            for (int64_t e = 0; e < hi - lo; ++e) {
              bv[e] = convert<T>(convert<acc_t<T>>(bv[e]) + convert<acc_t<T>>(av[e]));
            }
          }
        }
        return;
      }
      for (int64_t e = lo; e < hi; ++e) {
        for (int64_t k = 0; k < k_count; ++k) {
          const int64_t j = *reinterpret_cast<const I*>(p[2] + e * s[2] + k * i_k);
          T& av = *reinterpret_cast<T*>(p[0] + e * s[0] + k * a_k);
          T& bv = *reinterpret_cast<T*>(p[1] + e * s[1] + j * b_k);
          if constexpr (mode == IndexMode::kGather) {
            av = bv;
          } else {
            bv = convert<T>(convert<acc_t<T>>(bv) + convert<acc_t<T>>(av));
          }
        }
      }
    };
    if (n * k_count * sz < kParallelBytes) {
      run(0, n);
      return;
    }
#pragma omp parallel num_threads(num_threads())
    {
      const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
      run(n * t / threads, n * (t + 1) / threads);
    }
  });
}

// Calls f(TypeTag<I>{}) for the index dtype (the caller has checked it is int32 or int64).
template <class F>
void dispatch_index(DType d, F&& f) {
  if (d == kInt64) {
    f(TypeTag<int64_t>{});
  } else {
    DTR_INTERNAL_ASSERT(d == kInt32, "index dtype {}", d);
    f(TypeTag<int32_t>{});
  }
}

}  // namespace

void gather(const Tensor& out, const Tensor& x, const Tensor& index, int64_t dim) {
  dispatch_all(x.dtype(), "gather", [&]<class T>(TypeTag<T>) {
    dispatch_index(index.dtype(),
                   [&]<class I>(TypeTag<I>) { index_loop<IndexMode::kGather, T, I>(out, x, dim, index); });
  });
}

void scatter_add(const Tensor& x, const Tensor& index, const Tensor& src, int64_t dim) {
  dispatch_numeric(x.dtype(), "scatter_add_", [&]<class T>(TypeTag<T>) {
    dispatch_index(index.dtype(),
                   [&]<class I>(TypeTag<I>) { index_loop<IndexMode::kScatterAdd, T, I>(src, x, dim, index); });
  });
}

}  // namespace dtr::cpu
