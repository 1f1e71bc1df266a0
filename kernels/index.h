// Indexing along one dim, with torch semantics (shown for dim 0 of a 2-D x):
//   index_select  out[k][j] = x[index[k]][j]        index 1-D; out.size(0) = index.numel()
//   gather        out[i][j] = x[index[i][j]][j]     index has x's rank; out.shape = index.shape
//   index_add_    x[index[k]][j] += source[k][j]    backward of index_select
//   scatter_add_  x[index[i][j]][j] += src[i][j]    backward of gather
// Indices are int64 or int32 in [0, x.size(dim)) (no negative wrap, as in torch), else
// IndexError naming the value, its position, the dim and the size. Repeated indices add in
// index order whatever the thread count, so the bits never depend on the machine.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace dtr {

// Rows of x along dim picked by a 1-D index, as a new contiguous tensor.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// Elements of x picked along dim by an index of x's rank (index.size(d) <= x.size(d) for d != dim).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// Adds source's slices along dim into x at the rows a 1-D index names; returns x.
Tensor& index_add_(Tensor& x, int64_t dim, const Tensor& index, const Tensor& source);
// Adds src[i][j] into x[index[i][j]][j] (dim 0); index.size(d) <= src.size(d) for every d and
// <= x.size(d) for d != dim; only src's elements under index are read. Returns x.
Tensor& scatter_add_(Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace dtr
