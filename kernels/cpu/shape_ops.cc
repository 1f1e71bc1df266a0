#include "kernels/cpu/shape_ops.h"
#include "core/parallel.h"

#include <algorithm>

#include "core/cpu/copy.h"
#include "core/cpu/copy_bytes.h"
#include "core/cpu/stream_store.h"

namespace dtr::cpu {

namespace {

// Output bytes per parallel work item, and the size below which one thread does it all.
constexpr int64_t kChunkBytes = int64_t{256} << 10;
constexpr int64_t kParallelBytes = int64_t{1} << 20;

}  // namespace

void cat(const Tensor& out, const std::vector<Tensor>& inputs, int64_t dim) {
  const int64_t inner_bytes =
      shape_numel(std::span(out.shape()).subspan(dim + 1)) * static_cast<int64_t>(out.itemsize());
  const int64_t outer = shape_numel(std::span(out.shape()).first(dim));
  // Each output row (one index of the dims before `dim`) holds one block per input:
  // input i's block starts at row_offset[i] bytes into the row.
  const size_t n = inputs.size();
  std::vector<int64_t> row_offset(n + 1, 0);
  std::vector<char> contiguous(n);
  int64_t start = 0;  // along dim
  for (size_t i = 0; i < n; ++i) {
    const int64_t size = inputs[i].size(dim);
    row_offset[i + 1] = row_offset[i] + size * inner_bytes;
    contiguous[i] = inputs[i].is_contiguous();
    if (!contiguous[i] && inputs[i].numel() > 0) copy(out.narrow(dim, start, size), inputs[i]);
    start += size;
  }
  const int64_t row_bytes = row_offset[n];
  const int64_t total = outer * row_bytes;
  if (total == 0) return;
  char* dst = static_cast<char*>(out.data());
  const int64_t chunks = (total + kChunkBytes - 1) / kChunkBytes;
  // An output larger than the caches is streamed (stream_store.h): it would leave them before
  // being read, and its lines are then not read for ownership first.
  const bool streams = streams_output(total);
#pragma omp parallel num_threads(num_threads()) if (total >= kParallelBytes)
  {
#pragma omp for schedule(static) nowait
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t end = std::min(total, (c + 1) * kChunkBytes);
      for (int64_t p = c * kChunkBytes; p < end;) {
        const int64_t row = p / row_bytes, in_row = p % row_bytes;
        // The input whose block holds in_row (upper_bound skips empty blocks).
        const size_t i = static_cast<size_t>(std::upper_bound(row_offset.begin(), row_offset.end(), in_row) -
                                             row_offset.begin() - 1);
        const int64_t segment_end = std::min(end, row * row_bytes + row_offset[i + 1]);
        if (contiguous[i]) {
          const int64_t block_bytes = row_offset[i + 1] - row_offset[i];
          const char* src = static_cast<const char*>(inputs[i].data()) + row * block_bytes + (in_row - row_offset[i]);
          if (streams) {
            stream_store(dst + p, src, segment_end - p);
          } else {
            copy_bytes(dst + p, src, segment_end - p);
          }
        }
        p = segment_end;
      }
    }
    if (streams) stream_fence();
  }
}

}  // namespace dtr::cpu
