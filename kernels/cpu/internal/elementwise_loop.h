// The elementwise loop under every CPU elementwise kernel: map<Out, In...>(out, f, in...)
// writes out[i] = f(in[i]...) over out's shape, each input broadcast to it (stride 0).
//
// Elements are computed in opmath_t: float for bfloat16/float16 (loaded to float, rounded
// once on store), the element type otherwise. Runs whose strides all equal the itemsizes
// take a plain indexed loop that the compiler vectorises (16-bit floats go through float
// blocks: convert_block.h); out may equal an input exactly (in-place ops) but must not
// partially overlap one. Large maps are split across threads by element ranges. The
// helpers below pair map with the dtype dispatch of same-dtype unary, binary and
// tensor-scalar ops. (ATen's cpu_kernel, reduced.)
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/internal/convert_block.h"
#include "kernels/cpu/internal/strided_loop.h"
#include "kernels/parallel.h"
#include "kernels/tensor.h"

namespace dtr::cpu {

// The type an element is computed in: float for the 16-bit floats, the type itself otherwise.
template <class T>
using opmath_t = std::conditional_t<std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>, float, T>;

template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

// How contiguous loops address an element: bool as its byte, since GCC vectorises no loop
// that loads or stores a bool (a bool tensor holds only 0 and 1, so the byte is the value).
template <class T>
using bytes_t = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;

// Elements per block of the 16-bit path: its float buffers stay in L1.
inline constexpr int64_t kMapBlock = 256;

// Elements below which map runs on one thread (a thread start costs more than the work).
inline constexpr int64_t kMapGrain = int64_t{1} << 15;

// A contiguous run with a 16-bit float operand: blocks of the inputs are converted to
// their opmath type (convert_block, which vectorises), f runs over the blocks as a float
// loop, and its results are converted to Out the same way.
template <class Out, class... In, class F, size_t... K>
void map_contiguous_blocks(bytes_t<Out>* o, const std::tuple<const bytes_t<In>*...>& in, int64_t n, const F& f,
                           std::index_sequence<K...>) {
  using R = decltype(f(std::declval<opmath_t<In>>()...));
  std::tuple<std::array<bytes_t<opmath_t<In>>, kMapBlock>...> buf;
  std::array<bytes_t<R>, kMapBlock> result;
  for (int64_t b = 0; b < n; b += kMapBlock) {
    const int64_t m = std::min(kMapBlock, n - b);
    (convert_block(std::get<K>(in) + b, std::get<K>(buf).data(), m), ...);
    for (int64_t i = 0; i < m; ++i) {
      result[i] = static_cast<bytes_t<R>>(f(static_cast<opmath_t<In>>(std::get<K>(buf)[i])...));
    }
    convert_block(result.data(), o + b, m);
  }
}

// One run of map: contiguous (every stride equal to its itemsize) or strided. Flattened:
// every call in f is inlined, since a loop that calls out of line cannot vectorise (and
// GCC declines to inline helpers that many kernels instantiate).
template <class Out, class... In, class F, size_t... K>
[[gnu::flatten]] void map_run(std::array<char*, 1 + sizeof...(In)> p, std::array<int64_t, 1 + sizeof...(In)> s,
                              int64_t n, const F& f_ref, std::index_sequence<K...> k) {
  // A local copy of f: its captures (scalars) then cannot alias out, so the loop loads
  // them once instead of at every element.
  const F f = f_ref;
  if (s[0] == sizeof(Out) && ((s[K + 1] == sizeof(In)) && ...)) {
    auto* o = reinterpret_cast<bytes_t<Out>*>(p[0]);
    const std::tuple<const bytes_t<In>*...> in{reinterpret_cast<const bytes_t<In>*>(p[K + 1])...};
    if constexpr (is_16bit_float_v<Out> || (is_16bit_float_v<In> || ...)) {
      map_contiguous_blocks<Out, In...>(o, in, n, f, k);
    } else {
      // out is either disjoint from every input or equal to one: no loop-carried dependence.
#pragma GCC ivdep
      for (int64_t i = 0; i < n; ++i) {
        o[i] = static_cast<bytes_t<Out>>(
            convert<Out>(f(static_cast<opmath_t<In>>(static_cast<In>(std::get<K>(in)[i]))...)));
      }
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    *reinterpret_cast<Out*>(p[0] + i * s[0]) =
        convert<Out>(f(static_cast<opmath_t<In>>(*reinterpret_cast<const In*>(p[K + 1] + i * s[K + 1]))...));
  }
}

template <class>
using TensorRef = const Tensor&;

// out[i] = f(in[i]...) over out's shape, each input (element type In) broadcast to it and
// loaded as opmath_t<In>; the result is stored as Out. Split across num_threads() threads
// in contiguous ranges of elements (each element is computed alike on any thread count).
template <class Out, class... In, class F>
void map(const Tensor& out, const F& f, TensorRef<In>... in) {
  constexpr size_t N = 1 + sizeof...(In);
  const std::array<char*, N> base{static_cast<char*>(out.data()), static_cast<char*>(in.data())...};
  const std::array<std::vector<int64_t>, N> strides{broadcast_byte_strides(out, out.shape()),
                                                    broadcast_byte_strides(in, out.shape())...};
  parallel_for(out.numel(), kMapGrain, [&](int64_t begin, int64_t end) {
    for_each_run<N>(out.shape(), base, strides, begin, end,
                    [&f](std::array<char*, N> p, std::array<int64_t, N> s, int64_t n) {
                      map_run<Out, In...>(p, s, n, f, std::index_sequence_for<In...>());
                    });
  });
}

// Same-dtype unary and binary maps over the floating or the numeric dtypes.
template <class F>
void floating_unary(std::string_view op, const Tensor& out, const Tensor& x, const F& f) {
  dispatch_floating(x.dtype(), op, [&]<class T>(TypeTag<T>) { map<T, T>(out, f, x); });
}
template <class F>
void numeric_unary(std::string_view op, const Tensor& out, const Tensor& x, const F& f) {
  dispatch_numeric(x.dtype(), op, [&]<class T>(TypeTag<T>) { map<T, T>(out, f, x); });
}
template <class F>
void floating_binary(std::string_view op, const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  dispatch_floating(a.dtype(), op, [&]<class T>(TypeTag<T>) { map<T, T, T>(out, f, a, b); });
}
template <class F>
void numeric_binary(std::string_view op, const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  dispatch_numeric(a.dtype(), op, [&]<class T>(TypeTag<T>) { map<T, T, T>(out, f, a, b); });
}

// Same-dtype maps of a tensor and a scalar: out = f(a, k), k being s in a's opmath type.
template <class F>
void floating_scalar(std::string_view op, const Tensor& out, const Tensor& a, double s, const F& f) {
  dispatch_floating(a.dtype(), op, [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(s);
    map<T, T>(out, [k, &f](auto x) { return f(x, k); }, a);
  });
}
template <class F>
void numeric_scalar(std::string_view op, const Tensor& out, const Tensor& a, double s, const F& f) {
  dispatch_numeric(a.dtype(), op, [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(s);
    map<T, T>(out, [k, &f](auto x) { return f(x, k); }, a);
  });
}

}  // namespace dtr::cpu
