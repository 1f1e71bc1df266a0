#include "kernels/cpu/embedding.h"

#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/internal/gather_rows.h"
#include "kernels/cpu/internal/row_store.h"

namespace dtr::cpu {
namespace {

// The indices in row-major order as int64, each checked to lie in [0, rows); `table`
// names what has the rows, for the error.
std::vector<int64_t> read_indices(const Tensor& indices, int64_t rows, std::string_view op, std::string_view table) {
  const Tensor ic = indices.contiguous();
  std::vector<int64_t> out(static_cast<size_t>(ic.numel()));
  auto read = [&]<class I>(const I* p) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(p[i]);
  };
  if (ic.dtype() == kInt32) {
    read(ic.data_ptr<int32_t>());
  } else {
    read(ic.data_ptr<int64_t>());
  }
  for (size_t p = 0; p < out.size(); ++p) {
    if (out[p] >= 0 && out[p] < rows) continue;
    Shape position(static_cast<size_t>(indices.dim()));
    int64_t rest = static_cast<int64_t>(p);
    for (int64_t d = indices.dim() - 1; d >= 0; --d) {
      position[d] = rest % indices.size(d);
      rest /= indices.size(d);
    }
    throw IndexError(
        fmt::format("{}: index {} at position {} of the indices {} is out of range for {} rows ({}); "
                    "indices must lie in [0, {})",
                    op, out[p], position, describe(indices), rows, table, rows));
  }
  return out;
}

}  // namespace

void embedding(const Tensor& out, const Tensor& weight, const Tensor& indices) {
  const int64_t dim = weight.size(1);
  const std::vector<int64_t> idx = read_indices(indices, weight.size(0), "embedding", "weight " + describe(weight));
  const int64_t row_stride = weight.stride(0), col_stride = weight.stride(1);
  dispatch_all(weight.dtype(), "embedding", [&]<class T>(TypeTag<T>) {
    const T* pw = static_cast<const T*>(weight.data());
    T* po = static_cast<T*>(out.data());
    parallel_for(static_cast<int64_t>(idx.size()), std::max<int64_t>(1, 16384 / std::max<int64_t>(dim, 1)),
                 [&](int64_t begin, int64_t end) {
                   if (col_stride == 1) {
                     const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(T));
                     gather_rows(
                         reinterpret_cast<char*>(po + begin * dim), row_bytes, end - begin, row_bytes,
                         [&](int64_t k) { return reinterpret_cast<const char*>(pw + idx[begin + k] * row_stride); });
                     return;
                   }
                   for (int64_t p = begin; p < end; ++p) {
                     const T* row = pw + idx[p] * row_stride;
                     for (int64_t i = 0; i < dim; ++i) po[p * dim + i] = row[i * col_stride];
                   }
                 });
  });
}

void embedding_backward(const Tensor& out, const Tensor& grad, const Tensor& indices,
                        std::optional<int64_t> padding_idx) {
  const int64_t num_weights = out.size(0);
  const int64_t dim = grad.size(-1);
  const std::vector<int64_t> idx = read_indices(indices, num_weights, "embedding_backward", "num_weights");
  // Counting sort of positions by index, stable: row v's positions in increasing order
  // are order[start[v] .. start[v + 1]).
  std::vector<int64_t> start(static_cast<size_t>(num_weights) + 1, 0);
  for (int64_t v : idx) ++start[v + 1];
  for (int64_t v = 0; v < num_weights; ++v) start[v + 1] += start[v];
  std::vector<int64_t> order(idx.size());
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (size_t p = 0; p < idx.size(); ++p) order[next[idx[p]]++] = static_cast<int64_t>(p);

  const Tensor gc = grad.contiguous();
  // Mostly rows of zeros, a whole table of them: streamed past the caches (row_store.h).
  const bool streaming = streams_output(static_cast<int64_t>(out.nbytes()));
  dispatch_floating(grad.dtype(), "embedding_backward", [&]<class T>(TypeTag<T>) {
    using Acc = acc_t<T>;
    const T* pg = gc.data_ptr<T>();
    T* po = out.data_ptr<T>();
    parallel_for(num_weights, 64, [&](int64_t begin, int64_t end) {
      std::vector<Acc> acc(static_cast<size_t>(dim));
      for (int64_t v = begin; v < end; ++v) {
        std::fill(acc.begin(), acc.end(), Acc(0));
        if (v != padding_idx) {
          for (int64_t k = start[v]; k < start[v + 1]; ++k) {
            const T* row = pg + order[k] * dim;
            for (int64_t i = 0; i < dim; ++i) acc[i] += static_cast<Acc>(row[i]);
          }
        }
        store_row(acc.data(), po + v * dim, dim, streaming);
      }
      if (streaming) stream_fence();
    });
  });
}

}  // namespace dtr::cpu
