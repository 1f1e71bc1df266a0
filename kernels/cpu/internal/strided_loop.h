// for_each_run: the iteration under every CPU elementwise kernel (ATen's TensorIterator,
// reduced to its core).
//
// N operands share one iteration shape; operand k steps by strides[k][d] bytes along
// dim d (0 where it is broadcast). Dims are coalesced first (size-1 dims dropped,
// neighbours merged where every operand's strides allow), so a contiguous tensor of any
// rank is a single run. body(ptrs, inner_strides, n) is called once per innermost run of
// n elements; a body that sees every inner stride equal to its itemsize may take a
// contiguous (vectorisable) loop.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace dtr::cpu {

template <size_t N, class Body>
void for_each_run(std::span<const int64_t> shape, std::array<char*, N> base,
                  const std::array<std::vector<int64_t>, N>& byte_strides, Body&& body) {
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
  const size_t outer_dims = sizes.size() - 1;
  std::vector<int64_t> counter(outer_dims, 0);
  std::array<char*, N> ptrs = base;
  while (true) {
    body(ptrs, inner, sizes[0]);
    // Odometer over the outer dims (index 1..), innermost outer dim first.
    size_t d = 0;
    for (; d < outer_dims; ++d) {
      for (size_t k = 0; k < N; ++k) ptrs[k] += strides[k][d + 1];
      if (++counter[d] < sizes[d + 1]) break;
      for (size_t k = 0; k < N; ++k) ptrs[k] -= strides[k][d + 1] * sizes[d + 1];
      counter[d] = 0;
    }
    if (d == outer_dims) return;
  }
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
