// The elementwise loop under every CPU elementwise kernel: map<Out, In...>(out, f, in...)
// writes out[i] = f(in[i]...) over out's shape, each input broadcast to it (stride 0).
//
// Elements are computed in opmath_t: float for bfloat16/float16 (loaded to float, rounded
// once on store), the element type otherwise. Runs whose strides all equal the itemsizes
// take a plain indexed loop that the compiler vectorises (16-bit floats go through float
// blocks: convert_block.h); out may equal an input exactly (in-place ops) but must not
// partially overlap one. Large maps are split across threads by element ranges, and
// outputs larger than the caches are written with streaming stores (stream_store.h).
// (ATen's cpu_kernel, reduced.)
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cpu/convert_block.h"
#include "core/cpu/stream_store.h"
#include "core/cpu/strided_loop.h"
#include "core/parallel.h"
#include "core/tensor.h"

namespace dtr::cpu {

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

// Whether a map writes out directly or stages blocks in L1 and streams them (stream_store.h).
enum class Store : uint8_t { kDirect, kStreaming };

// A contiguous run, in blocks of kMapBlock elements. Inputs in a 16-bit float are
// converted to float blocks first (convert_block, which vectorises) and f runs over them as
// a float loop; other inputs are read in place. Results go to out directly, converted
// alike, or to an L1 block that is streamed to out.
template <class Out, class... In, class F, size_t... K>
void map_contiguous(bytes_t<Out>* o, const std::tuple<const bytes_t<In>*...>& in, int64_t n, const F& f, Store store,
                    std::index_sequence<K...>) {
  using R = decltype(f(std::declval<opmath_t<In>>()...));
  constexpr bool kConverts = is_16bit_float_v<Out> || (is_16bit_float_v<In> || ...);
  std::tuple<std::array<bytes_t<opmath_t<In>>, is_16bit_float_v<In> ? kMapBlock : 0>...> buf;
  std::array<bytes_t<R>, kConverts ? kMapBlock : 0> result;
  std::array<bytes_t<Out>, kMapBlock> staged;
  for (int64_t b = 0; b < n; b += kMapBlock) {
    const int64_t m = std::min(kMapBlock, n - b);
    bytes_t<Out>* dst = store == Store::kStreaming ? staged.data() : o + b;
    if constexpr (kConverts) {
      (
          [&] {
            if constexpr (is_16bit_float_v<In>) convert_block(std::get<K>(in) + b, std::get<K>(buf).data(), m);
          }(),
          ...);
      auto operand = [&]<size_t k>(std::integral_constant<size_t, k>, int64_t i) {
        using T = std::tuple_element_t<k, std::tuple<In...>>;
        if constexpr (is_16bit_float_v<T>) {
          return std::get<k>(buf)[i];
        } else {
          return static_cast<opmath_t<T>>(static_cast<T>(std::get<k>(in)[b + i]));
        }
      };
      for (int64_t i = 0; i < m; ++i) {
        result[i] = static_cast<bytes_t<R>>(f(operand(std::integral_constant<size_t, K>{}, i)...));
      }
      convert_block(result.data(), dst, m);
    } else {
      // dst is disjoint from every input or equal to one: no loop-carried dependence.
#pragma GCC ivdep
      for (int64_t i = 0; i < m; ++i) {
        dst[i] = static_cast<bytes_t<Out>>(
            convert<Out>(f(static_cast<opmath_t<In>>(static_cast<In>(std::get<K>(in)[b + i]))...)));
      }
    }
    if (store == Store::kStreaming) stream_store(o + b, staged.data(), m * static_cast<int64_t>(sizeof(Out)));
  }
}

// One run of map: contiguous (every stride equal to its itemsize) or strided. Flattened:
// every call in f is inlined, since a loop that calls out of line cannot vectorise (and
// GCC declines to inline helpers that many kernels instantiate).
template <class Out, class... In, class F, size_t... K>
[[gnu::flatten]] void map_run(std::array<char*, 1 + sizeof...(In)> p, std::array<int64_t, 1 + sizeof...(In)> s,
                              int64_t n, const F& f_ref, Store store, std::index_sequence<K...> k) {
  // A local copy of f: its captures (scalars) then cannot alias out, so the loop loads
  // them once instead of at every element.
  const F f = f_ref;
  if (s[0] == sizeof(Out) && ((s[K + 1] == sizeof(In)) && ...)) {
    map_contiguous<Out, In...>(reinterpret_cast<bytes_t<Out>*>(p[0]),
                               std::tuple<const bytes_t<In>*...>{reinterpret_cast<const bytes_t<In>*>(p[K + 1])...}, n,
                               f, store, k);
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
  // Only a contiguous output is streamed: its runs are long enough to fill whole lines.
  const Store store =
      out.is_contiguous() && static_cast<int64_t>(out.nbytes()) >= kStreamFrom ? Store::kStreaming : Store::kDirect;
  parallel_for(out.numel(), kMapGrain, [&](int64_t begin, int64_t end) {
    for_each_run<N>(out.shape(), base, strides, begin, end,
                    [&f, store](std::array<char*, N> p, std::array<int64_t, N> s, int64_t n) {
                      map_run<Out, In...>(p, s, n, f, store, std::index_sequence_for<In...>());
                    });
    if (store == Store::kStreaming) stream_fence();
  });
}

// Same-dtype unary and binary maps over the floating or the numeric dtypes: map with the
// dtype dispatch.
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
    map<T, T>(
        out, [k, &f](auto x) { return f(x, k); }, a);
  });
}
template <class F>
void numeric_scalar(std::string_view op, const Tensor& out, const Tensor& a, double s, const F& f) {
  dispatch_numeric(a.dtype(), op, [&]<class T>(TypeTag<T>) {
    const auto k = static_cast<opmath_t<T>>(s);
    map<T, T>(
        out, [k, &f](auto x) { return f(x, k); }, a);
  });
}

}  // namespace dtr::cpu
