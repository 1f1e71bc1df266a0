// Tensors as a CUDA map kernel reads them (core/cuda/map_layout.h): the output's shape,
// and each operand's data and strides broadcast to it.
#pragma once

#include <string_view>

#include "core/cuda/map_layout.h"
#include "core/tensor.h"

namespace dtr::internal {

// NotImplementedError naming `op` and the shape past cuda::kMaxMapDims dims.
cuda::MapShape map_shape(std::string_view op, const Shape& shape);
// t's data and strides over `shape`, 0 where t broadcasts (t broadcasts to shape).
cuda::MapOperand map_operand(const Tensor& t, const Shape& shape);

}  // namespace dtr::internal
