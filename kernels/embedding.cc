#include "kernels/embedding.h"

#include "kernels/cpu/embedding.h"
#include "kernels/internal/device_not_implemented.h"
#include "kernels/trace.h"

namespace dtr {
namespace {

void check_indices(const Tensor& indices, const Tensor& other, std::string_view op) {
  DTR_CHECK(indices.dtype() == kInt32 || indices.dtype() == kInt64, TypeError, "{}: indices {} must be int32 or int64",
            op, describe(indices));
  DTR_CHECK(indices.device() == other.device(), ValueError, "{}: indices {} and {} are on different devices", op,
            describe(indices), describe(other));
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
    case kCUDA:
      throw_device_not_implemented("embedding", weight.device(),
                                   fmt::format("{} and {}", describe(weight), describe(indices)));
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
    case kCUDA:
      throw_device_not_implemented(op, grad.device(), fmt::format("{} and {}", describe(grad), describe(indices)));
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
