#include "kernels/cpu/random.h"

#include <vector>

#include "kernels/parallel.h"
#include "kernels/philox.h"

namespace dtr::cpu {
namespace {

// Sets every element of t to convert<T>(draw(global index)); threads split the local
// elements, and each element's value depends on its global index alone.
template <class Draw>
void fill_by_global_index(const Tensor& t, const ShardLayout& layout, std::string_view op, Draw draw) {
  const int64_t n = t.numel();
  const int64_t nd = t.dim();
  const Shape& sizes = t.shape();
  const Shape& strides = t.strides();
  const Shape global_strides = contiguous_strides(layout.global_shape);
  int64_t global_base = 0;
  for (int64_t d = 0; d < nd; ++d) global_base += layout.offset[d] * global_strides[d];
  dispatch_all(t.dtype(), op, [&]<class T>(TypeTag<T>) {
    T* data = static_cast<T*>(t.data());
    parallel_for(n, 4096, [&](int64_t begin, int64_t end) {
      // Local and global positions of element `begin`, then an odometer over the dims.
      std::vector<int64_t> index(nd);
      int64_t local = 0, global = global_base, rest = begin;
      for (int64_t d = nd - 1; d >= 0; --d) {
        index[d] = rest % sizes[d];
        rest /= sizes[d];
        local += index[d] * strides[d];
        global += index[d] * global_strides[d];
      }
      for (int64_t i = begin; i < end; ++i) {
        data[local] = convert<T>(draw(static_cast<uint64_t>(global)));
        for (int64_t d = nd - 1; d >= 0; --d) {
          local += strides[d];
          global += global_strides[d];
          if (++index[d] < sizes[d]) break;
          local -= strides[d] * sizes[d];
          global -= global_strides[d] * sizes[d];
          index[d] = 0;
        }
      }
    });
  });
}

}  // namespace

void uniform(const Tensor& t, double lo, double hi, uint64_t seed, const ShardLayout& layout) {
  fill_by_global_index(t, layout, "uniform_",
                       [=](uint64_t i) { return lo + (hi - lo) * philox_uniform(seed, i); });
}

void normal(const Tensor& t, double mean, double std, uint64_t seed, const ShardLayout& layout) {
  fill_by_global_index(t, layout, "normal_", [=](uint64_t i) { return mean + std * philox_normal(seed, i); });
}

void bernoulli(const Tensor& t, double p, uint64_t seed, const ShardLayout& layout) {
  fill_by_global_index(t, layout, "bernoulli", [=](uint64_t i) { return philox_bernoulli(seed, i, p) ? 1.0 : 0.0; });
}

}  // namespace dtr::cpu
