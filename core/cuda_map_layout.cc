#include "core/cuda_map_layout.h"

namespace dtr::internal {

cuda::MapShape map_shape(std::string_view op, const Shape& shape) {
  DTR_CHECK(static_cast<int64_t>(shape.size()) <= cuda::kMaxMapDims, NotImplementedError,
            "{}: a result of shape {} has {} dims; CUDA elementwise kernels take at most {}", op, shape, shape.size(),
            cuda::kMaxMapDims);
  cuda::MapShape s;
  s.ndim = static_cast<int>(shape.size());
  for (int d = 0; d < s.ndim; ++d) {
    s.sizes[d] = shape[d];
    s.numel *= shape[d];
  }
  return s;
}

cuda::MapOperand map_operand(const Tensor& t, const Shape& shape) {
  const Tensor view = t.expand(shape);  // stride 0 where t broadcasts
  cuda::MapOperand o;
  o.data = view.numel() > 0 ? view.data() : nullptr;
  for (int64_t d = 0; d < view.dim(); ++d) o.strides[d] = view.stride(d);
  return o;
}

}  // namespace dtr::internal
