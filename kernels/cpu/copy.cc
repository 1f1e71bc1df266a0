#include "kernels/cpu/copy.h"

#include <cstring>

#include "kernels/cpu/internal/strided_loop.h"

namespace dtr::cpu {

void copy(const Tensor& dst, const Tensor& src) {
  std::array<char*, 2> base{static_cast<char*>(dst.data()),
                            static_cast<char*>(const_cast<void*>(src.data()))};
  std::array<std::vector<int64_t>, 2> strides{broadcast_byte_strides(dst, dst.shape()),
                                              broadcast_byte_strides(src, dst.shape())};
  dispatch_all(dst.dtype(), "copy", [&]<class To>(TypeTag<To>) {
    dispatch_all(src.dtype(), "copy", [&]<class From>(TypeTag<From>) {
      for_each_run<2>(dst.shape(), base, strides, [](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
        if constexpr (std::is_same_v<To, From>) {
          if (s[0] == sizeof(To) && s[1] == sizeof(From)) {
            std::memcpy(p[0], p[1], static_cast<size_t>(n) * sizeof(To));
            return;
          }
        }
        if (s[0] == sizeof(To) && s[1] == sizeof(From)) {
          To* o = reinterpret_cast<To*>(p[0]);
          const From* in = reinterpret_cast<const From*>(p[1]);
          for (int64_t i = 0; i < n; ++i) o[i] = convert<To>(in[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) {
            *reinterpret_cast<To*>(p[0] + i * s[0]) = convert<To>(*reinterpret_cast<const From*>(p[1] + i * s[1]));
          }
        }
      });
    });
  });
}

void fill(const Tensor& dst, double value) {
  std::array<char*, 1> base{static_cast<char*>(dst.data())};
  std::array<std::vector<int64_t>, 1> strides{broadcast_byte_strides(dst, dst.shape())};
  dispatch_all(dst.dtype(), "fill_", [&]<class T>(TypeTag<T>) {
    const T v = convert<T>(value);
    for_each_run<1>(dst.shape(), base, strides, [v](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
    });
  });
}

}  // namespace dtr::cpu
