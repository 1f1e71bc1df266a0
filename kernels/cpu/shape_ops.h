// CPU kernels of the shape ops that copy: cat.
//
// The caller (kernels/shape_ops.cc) has checked shapes, dtypes and devices; out is
// contiguous. Contiguous inputs move as whole blocks with memcpy, split across threads
// by output bytes (so one huge block still uses every thread); strided inputs go
// through cpu::copy into their slice of out.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace dtr::cpu {

void cat(const Tensor& out, const std::vector<Tensor>& inputs, int64_t dim);

}  // namespace dtr::cpu
