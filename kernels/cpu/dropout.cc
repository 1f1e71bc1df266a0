#include "kernels/cpu/dropout.h"

#include "kernels/cpu/internal/elementwise_loop.h"

namespace dtr::cpu {

void masked_scale(const Tensor& out, const Tensor& x, const Tensor& mask, double scale) {
  dispatch_floating(x.dtype(), "dropout", [&]<class T>(TypeTag<T>) {
    const auto s = static_cast<opmath_t<T>>(scale);
    map<T, T, bool>(
        out, [s](auto v, bool keep) { return keep ? v * s : decltype(v)(0); }, x, mask);
  });
}

}  // namespace dtr::cpu
