// Filling and factory functions: fill_, zeros, ones, full, arange.
//
// Values are given as double and converted to the tensor's dtype (bf16/f16 round to
// nearest-even). arange(start, end, step) holds ceil((end - start) / step) values,
// start + i * step (one fused multiply-add, the same bits on CPU and CUDA), like torch.arange.
#pragma once

#include "core/tensor.h"

namespace dtr {

Tensor& fill_(Tensor& t, double value);
Tensor full(Shape shape, double value, DType dtype = kFloat32, Device device = kCPU);
Tensor zeros(Shape shape, DType dtype = kFloat32, Device device = kCPU);
Tensor ones(Shape shape, DType dtype = kFloat32, Device device = kCPU);
Tensor zeros_like(const Tensor& t);
Tensor arange(double start, double end, double step = 1.0, DType dtype = kInt64, Device device = kCPU);
inline Tensor arange(int64_t end, DType dtype = kInt64, Device device = kCPU) {
  return arange(0.0, static_cast<double>(end), 1.0, dtype, device);
}

}  // namespace dtr
