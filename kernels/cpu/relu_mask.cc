#include "kernels/cpu/relu_mask.h"

#include <algorithm>
#include <cstdint>

#include "core/parallel.h"

namespace dtr::cpu {
namespace {

// Words per parallel_for task: 64 Ki elements.
constexpr int64_t kWordGrain = 2048;

}  // namespace

void relu_mask(const Tensor& words, const Tensor& y) {
  const int64_t n = y.numel();
  auto* out = reinterpret_cast<uint32_t*>(words.data_ptr<int32_t>());
  dispatch_floating(y.dtype(), "relu_mask", [&]<class T>(TypeTag<T>) {
    const T* in = y.data_ptr<T>();
    parallel_for(words.numel(), kWordGrain, [&](int64_t begin, int64_t end) {
      for (int64_t w = begin; w < end; ++w) {
        const int64_t first = 32 * w, count = std::min<int64_t>(32, n - first);
        uint32_t bits = 0;
        for (int64_t j = 0; j < count; ++j) {
          bits |= static_cast<uint32_t>(!(convert<opmath_t<T>>(in[first + j]) <= opmath_t<T>(0))) << j;
        }
        out[w] = bits;
      }
    });
  });
}

void apply_relu_mask(const Tensor& grad, const Tensor& words) {
  const int64_t n = grad.numel();
  const auto* bits = reinterpret_cast<const uint32_t*>(words.data_ptr<int32_t>());
  dispatch_floating(grad.dtype(), "apply_relu_mask_", [&]<class T>(TypeTag<T>) {
    T* g = grad.data_ptr<T>();
    parallel_for(words.numel(), kWordGrain, [&](int64_t begin, int64_t end) {
      for (int64_t w = begin; w < end; ++w) {
        const int64_t first = 32 * w, count = std::min<int64_t>(32, n - first);
        const uint32_t word = bits[w];
        T* gw = g + first;
        // A select, not a branch: the bits are data, so a branch per element would mispredict
        // about half the time; the select vectorizes (a variable shift, a compare, a blend).
        for (int64_t j = 0; j < count; ++j) gw[j] = ((word >> j) & 1U) != 0 ? gw[j] : T(0);
      }
    });
  });
}

}  // namespace dtr::cpu
