// for_each_run: the iteration under every CPU elementwise kernel (ATen's TensorIterator,
// reduced to its core).
//
// N operands share one iteration shape; operand k steps by strides[k][d] bytes along
// dim d (0 where it is broadcast). Dims are coalesced first (size-1 dims dropped,
// neighbours merged where every operand's strides allow), so a contiguous tensor of any
// rank is a single run. body(ptrs, inner_strides, n) is called once per innermost run of
// n elements; a body that sees every inner stride equal to its itemsize may take a
// contiguous (vectorisable) loop. A range [begin, end) of the elements in row-major order
// may be given instead of all of them, to split the iteration across threads.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace dtr::cpu {

// for_each_run restricted to the elements [begin, end) of the iteration, counted in
// row-major order: the same runs, the first and the last possibly cut short. Disjoint
// ranges cover disjoint elements, which is how a loop is split across threads.
template <size_t N, class Body>
void for_each_run(std::span<const int64_t> shape, std::array<char*, N> base,
                  const std::array<std::vector<int64_t>, N>& byte_strides, int64_t begin, int64_t end, Body&& body) {
  if (begin >= end) return;
  // Coalesce: dims listed innermost first.
  std::vector<int64_t> sizes;
  std::array<std::vector<int64_t>, N> strides;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (size_t k = 0; k < N && merge; ++k) {
      merge = byte_strides[k][d] == strides[k].back() * sizes.back();
    }
    if (merge) {
      sizes.back() *= shape[d];
    } else {
      sizes.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) strides[k].push_back(byte_strides[k][d]);
    }
  }
  if (sizes.empty()) {  // a single element
    std::array<int64_t, N> unit{};
    body(base, unit, int64_t{1});
    return;
  }
  std::array<int64_t, N> inner;
  for (size_t k = 0; k < N; ++k) inner[k] = strides[k][0];
  // Position of element `begin`: its index within the innermost run, and the odometer
  // counters of the outer dims.
  const size_t outer_dims = sizes.size() - 1;
  std::vector<int64_t> counter(outer_dims, 0);
  std::array<char*, N> ptrs = base;
  int64_t in_run = begin % sizes[0];
  for (int64_t d = 0, rest = begin / sizes[0]; d < static_cast<int64_t>(outer_dims); ++d) {
    counter[d] = rest % sizes[d + 1];
    rest /= sizes[d + 1];
    for (size_t k = 0; k < N; ++k) ptrs[k] += counter[d] * strides[k][d + 1];
  }
  for (int64_t left = end - begin;;) {
    const int64_t n = std::min(sizes[0] - in_run, left);
    std::array<char*, N> run = ptrs;
    for (size_t k = 0; k < N; ++k) run[k] += in_run * inner[k];
    body(run, inner, n);
    left -= n;
    if (left == 0) return;
    in_run = 0;
    // Odometer over the outer dims (index 1..), innermost outer dim first.
    for (size_t d = 0; d < outer_dims; ++d) {
      for (size_t k = 0; k < N; ++k) ptrs[k] += strides[k][d + 1];
      if (++counter[d] < sizes[d + 1]) break;
      for (size_t k = 0; k < N; ++k) ptrs[k] -= strides[k][d + 1] * sizes[d + 1];
      counter[d] = 0;
    }
  }
}

template <size_t N, class Body>
void for_each_run(std::span<const int64_t> shape, std::array<char*, N> base,
                  const std::array<std::vector<int64_t>, N>& byte_strides, Body&& body) {
  int64_t numel = 1;
  for (int64_t size : shape) numel *= size;
  for_each_run<N>(shape, base, byte_strides, 0, numel, std::forward<Body>(body));
}

// Byte strides of a tensor's element strides, broadcast (stride 0) to out_shape.
template <class TensorLike>
std::vector<int64_t> broadcast_byte_strides(const TensorLike& t, std::span<const int64_t> out_shape) {
  std::vector<int64_t> s(out_shape.size(), 0);
  const int64_t lead = static_cast<int64_t>(out_shape.size()) - t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1) s[lead + d] = t.stride(d) * static_cast<int64_t>(t.itemsize());
  }
  return s;
}

}  // namespace dtr::cpu
