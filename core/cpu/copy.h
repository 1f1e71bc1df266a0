// CPU copy with dtype conversion and broadcasting: dst[i] = convert(src[i]).
//
// dst and src are CPU tensors; src's shape broadcasts to dst's. Same-dtype contiguous
// runs are memcpy; conversions round bf16/f16 to nearest-even. Large copies and fills are
// split across num_threads() threads (each element is written once, whatever the split).
#pragma once

#include "core/tensor.h"

namespace dtr::cpu {

void copy(const Tensor& dst, const Tensor& src);
void fill(const Tensor& dst, double value);

}  // namespace dtr::cpu
