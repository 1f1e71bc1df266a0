#include "kernels/cpu/dropout.h"

#include "kernels/cpu/internal/strided_loop.h"

namespace dtr::cpu {

Tensor masked_scale(const Tensor& x, const Tensor& mask, double scale) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  std::array<char*, 3> base{static_cast<char*>(out.data()), static_cast<char*>(const_cast<void*>(x.data())),
                            static_cast<char*>(const_cast<void*>(mask.data()))};
  std::array<std::vector<int64_t>, 3> strides{broadcast_byte_strides(out, out.shape()),
                                              broadcast_byte_strides(x, out.shape()),
                                              broadcast_byte_strides(mask, out.shape())};
  dispatch_floating(x.dtype(), "dropout", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const Acc s = static_cast<Acc>(scale);
    for_each_run<3>(out.shape(), base, strides, [s](std::array<char*, 3> p, std::array<int64_t, 3> st, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const bool keep = *reinterpret_cast<const bool*>(p[2] + i * st[2]);
        const Acc v = keep ? static_cast<Acc>(*reinterpret_cast<const T*>(p[1] + i * st[1])) * s : Acc(0);
        *reinterpret_cast<T*>(p[0] + i * st[0]) = convert<T>(v);
      }
    });
  });
  return out;
}

}  // namespace dtr::cpu
