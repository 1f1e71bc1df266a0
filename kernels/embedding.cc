#include "kernels/embedding.h"

#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/embedding.h"
#include "kernels/reduce.h"

namespace dtr {
namespace {

void check_indices(const Tensor& indices, const Tensor& other, std::string_view op) {
  DTR_CHECK(indices.dtype() == kInt32 || indices.dtype() == kInt64, TypeError, "{}: indices {} must be int32 or int64",
            op, describe(indices));
  DTR_CHECK(indices.device() == other.device(), ValueError, "{}: indices {} and {} are on different devices", op,
            describe(indices), describe(other));
}

// On CUDA the indices are checked by a min/max reduction read back on the host: one
// synchronisation of the stream per call (the CPU kernels check as they read).
void check_cuda_range(const Tensor& indices, int64_t rows, std::string_view op) {
  if (indices.numel() == 0) return;
  DTR_CHECK(indices.numel() < (int64_t{1} << 31), NotImplementedError,
            "{}: {} indices; the CUDA kernels take fewer than 2^31", op, indices.numel());
  const auto lo = static_cast<int64_t>(min(indices).item()), hi = static_cast<int64_t>(max(indices).item());
  DTR_CHECK(lo >= 0 && hi < rows, IndexError,
            "{}: the indices {} hold values in [{}, {}]; every index must be in [0, {}) for {} rows", op,
            describe(indices), lo, hi, rows, rows);
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  DTR_CHECK(weight.dim() == 2, ValueError, "embedding: weight {} must be 2-D [num_embeddings, embedding_dim]",
            describe(weight));
  check_indices(indices, weight, "embedding");
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.size(1));
  Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  const trace::Span span("embedding", trace::Category::kKernel);
  switch (weight.device().type) {
    case kCPU: cpu::embedding(out, weight, indices); return out;
    case kCUDA: {
      check_cuda_range(indices, weight.size(0), "embedding");
      const Tensor w = weight.contiguous(), idx = indices.contiguous();
      const int device = weight.device().index;
      cuda::embedding(out.data(), w.data(), idx.data(), idx.dtype(), idx.numel(), weight.size(1), weight.dtype(),
                      device, cuda::current_stream(device).handle());
      return out;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                          std::optional<int64_t> padding_idx) {
  constexpr std::string_view op = "embedding_backward";
  check_indices(indices, grad, op);
  Shape expected = indices.shape();
  expected.push_back(grad.dim() > 0 ? grad.size(-1) : 0);
  DTR_CHECK(grad.dim() == indices.dim() + 1 && grad.shape() == expected, ValueError,
            "{}: grad {} must have the indices' shape {} plus one embedding dim", op, describe(grad), indices.shape());
  DTR_CHECK(is_floating(grad.dtype()), TypeError,
            "{}: grad {} is not floating; it takes float32, float64, bfloat16 or float16", op, describe(grad));
  DTR_CHECK(num_weights >= 0, ValueError, "{}: num_weights {} must be >= 0", op, num_weights);
  if (padding_idx) {
    DTR_CHECK(*padding_idx >= -num_weights && *padding_idx < num_weights, ValueError,
              "{}: padding_idx {} is out of range for {} rows (legal: [{}, {}))", op, *padding_idx, num_weights,
              -num_weights, num_weights);
    if (*padding_idx < 0) *padding_idx += num_weights;
  }
  Tensor out = Tensor::empty({num_weights, grad.size(-1)}, grad.dtype(), grad.device());
  const trace::Span span("embedding_backward", trace::Category::kKernel);
  switch (grad.device().type) {
    case kCPU: cpu::embedding_backward(out, grad, indices, padding_idx); return out;
    case kCUDA: {
      check_cuda_range(indices, num_weights, op);
      const Tensor g = grad.contiguous(), idx = indices.contiguous();
      const int device = grad.device().index;
      const size_t bytes = cuda::embedding_backward_scratch_bytes(idx.numel(), device);
      const Tensor scratch = Tensor::empty({static_cast<int64_t>((bytes + 7) / 8)}, kInt64, grad.device());
      cuda::embedding_backward(out.data(), g.data(), idx.data(), idx.dtype(), idx.numel(), grad.size(-1), num_weights,
                               padding_idx.value_or(-1), scratch.data(), bytes, grad.dtype(), device,
                               cuda::current_stream(device).handle());
      return out;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
