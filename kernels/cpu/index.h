// CPU kernels of the indexing ops: one gather and one scatter-add along a dim.
//
// Both walk index's positions: the dims other than dim form a slice that for_each_run
// coalesces, and k runs along dim inside each slice position. index_select and index_add_
// are these with a 1-D index expanded (stride 0) over the slice, which takes a memcpy /
// vector-add path. Threads split the slice, never k, so an element of x that several
// indices name receives its adds in index order on one thread: the bits do not depend on
// the thread count. The caller has checked shapes, dtypes and that indices are in range.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dtr::cpu {

// out[.., k, ..] = x[.., index[.., k, ..], ..] along dim; out has index's shape.
void gather(const Tensor& out, const Tensor& x, const Tensor& index, int64_t dim);
// x[.., index[.., k, ..], ..] += src[.., k, ..] along dim, over index's shape.
void scatter_add(const Tensor& x, const Tensor& index, const Tensor& src, int64_t dim);

}  // namespace dtr::cpu
