#include "kernels/index.h"

#include "core/check_writable.h"
#include "core/cuda/stream.h"
#include "core/cuda_map_layout.h"
#include "core/trace.h"
#include "kernels/cpu/index.h"
#include "kernels/cuda/index.h"
#include "kernels/fill.h"

namespace dtr {

namespace {

using internal::check_writable;

// Checks what every indexing op needs of x and index; returns the wrapped dim.
int64_t check_operands(std::string_view op, const Tensor& x, int64_t dim, const Tensor& index) {
  DTR_CHECK(x.defined() && index.defined(), ValueError, "{}: x ({}) and index ({}) must be defined", op, describe(x),
            describe(index));
  DTR_CHECK(x.dim() > 0, ValueError, "{}: x is 0-d ({}); it needs a dim to index along", op, describe(x));
  dim = wrap_dim(dim, x.dim(), op);
  DTR_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, TypeError, "{}: index is {}; it must be int64 or int32",
            op, describe(index));
  DTR_CHECK(index.device() == x.device(), ValueError, "{}: index is on {} but x is on {}; both need the same device",
            op, index.device(), x.device());
  return dim;
}

// Checks that the tensor an add reads from matches x in dtype and device, and that the add is defined.
void check_addend(std::string_view op, const Tensor& x, const Tensor& addend, std::string_view name) {
  DTR_CHECK(addend.defined(), ValueError, "{}: {} must be defined", op, name);
  DTR_CHECK(addend.dtype() == x.dtype(), TypeError, "{}: {} is {} but x is {}; both need the same dtype", op, name,
            describe(addend), describe(x));
  DTR_CHECK(x.dtype() != kBool, TypeError, "{}: x is {}; adds need a numeric dtype", op, describe(x));
  DTR_CHECK(addend.device() == x.device(), ValueError, "{}: {} is on {} but x is on {}; both need the same device", op,
            name, addend.device(), x.device());
}

// Throws IndexError for the first index outside [0, size), naming its value and position.
void check_index_range(std::string_view op, const Tensor& index, int64_t dim, const Tensor& x) {
  const int64_t size = x.size(dim);
  const Tensor flat = index.contiguous();
  auto first_bad = [&]<class I>(TypeTag<I>) -> int64_t {
    const I* p = flat.data_ptr<I>();
    for (int64_t i = 0; i < flat.numel(); ++i) {
      if (p[i] < 0 || p[i] >= size) return i;
    }
    return -1;
  };
  const int64_t bad = index.dtype() == kInt64 ? first_bad(TypeTag<int64_t>{}) : first_bad(TypeTag<int32_t>{});
  if (bad < 0) return;
  const int64_t value = index.dtype() == kInt64 ? flat.data_ptr<int64_t>()[bad] : flat.data_ptr<int32_t>()[bad];
  Shape position(index.dim());
  for (int64_t d = index.dim() - 1, rest = bad; d >= 0; --d) {
    position[d] = rest % index.size(d);
    rest /= index.size(d);
  }
  throw IndexError(
      fmt::format("{}: index {} at position {} is out of range for dim {} of size {} (x is {}); "
                  "indices must be in [0, {})",
                  op, value, position, dim, size, describe(x), size));
}

// t's data and strides as the CUDA kernels read them (over index's shape; t may be larger).
cuda::MapOperand cuda_operand(const Tensor& t) {
  cuda::MapOperand o;
  o.data = t.numel() > 0 ? t.data() : nullptr;
  for (int64_t d = 0; d < t.dim(); ++d) o.strides[d] = t.stride(d);
  return o;
}

enum class CudaIndexOp { kGather, kScatterAdd };

// The CUDA path of the four ops: `a` has index's shape (out, or src/source), x is indexed
// along dim by `index` (expanded for index_select and index_add_; undefined when there is
// nothing to move); `checked` is the index the caller gave. A kernel checks `checked` on the device and sets a flag,
// which the gather or scatter kernel queued after it reads (doing nothing when set, so x is left unchanged); the flag
// is read back once, one synchronisation of the stream per call. On failure the index is copied to the host for the
// CPU's IndexError.
void cuda_index(std::string_view op, CudaIndexOp kind, const Tensor& a, const Tensor& x, const Tensor& index,
                const Tensor& checked, int64_t dim) {
  if (checked.numel() == 0) return;
  DTR_CHECK(x.dim() <= cuda::kMaxMapDims, NotImplementedError, "{}: x {} has {} dims; the CUDA kernels take at most {}",
            op, describe(x), x.dim(), cuda::kMaxMapDims);
  const int device = x.device().index;
  const cudaStream_t stream = cuda::current_stream(device).handle();
  const Tensor bad = zeros({1}, kInt32, x.device());
  auto* flag = static_cast<int32_t*>(bad.data());
  cuda::check_index(flag, cuda_operand(checked), checked.dtype(), internal::map_shape(op, checked.shape()), x.size(dim),
                    device, stream);
  if (index.defined() && index.numel() > 0) {
    const cuda::MapShape shape = internal::map_shape(op, index.shape());
    if (kind == CudaIndexOp::kGather) {
      cuda::gather(cuda_operand(a), cuda_operand(x), cuda_operand(index), index.dtype(), shape, static_cast<int>(dim),
                   flag, x.dtype(), device, stream);
    } else {
      cuda::scatter_add(cuda_operand(x), cuda_operand(index), index.dtype(), cuda_operand(a), shape,
                        static_cast<int>(dim), flag, x.dtype(), device, stream);
    }
  }
  if (bad.item() == 0) return;
  check_index_range(op, checked.to(kCPU), dim, x);
  DTR_INTERNAL_ASSERT(false, "{}: the CUDA index check flagged {} but the host finds every index in range", op,
                      describe(checked));
}

// index viewed with x's rank (1 everywhere but dim) and expanded to shape: the gather index
// that index_select and index_add_ are.
Tensor expand_along(const Tensor& index, int64_t dim, const Shape& shape) {
  Shape view(shape.size(), 1);
  view[dim] = index.numel();
  return index.contiguous().view(view).expand(shape);
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  dim = check_operands("index_select", x, dim, index);
  DTR_CHECK(index.dim() == 1, ValueError, "index_select: index is {}; it must be 1-D", describe(index));
  Shape shape = x.shape();
  shape[dim] = index.numel();
  Tensor out = Tensor::empty(std::move(shape), x.dtype(), x.device());
  const trace::Span span("index_select", trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU:
      check_index_range("index_select", index, dim, x);
      if (out.numel() > 0) cpu::gather(out, x, expand_along(index, dim, out.shape()), dim);
      return out;
    case kCUDA:
      cuda_index("index_select", CudaIndexOp::kGather, out, x,
                 out.numel() > 0 ? expand_along(index, dim, out.shape()) : Tensor(), index, dim);
      return out;
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  dim = check_operands("gather", x, dim, index);
  DTR_CHECK(index.dim() == x.dim(), ValueError, "gather: index is {} and x is {}; they need the same number of dims",
            describe(index), describe(x));
  for (int64_t d = 0; d < x.dim(); ++d) {
    DTR_CHECK(d == dim || index.size(d) <= x.size(d), ValueError,
              "gather: index {} is larger than x {} in dim {}; index.size(d) <= x.size(d) is needed for every d != {}",
              describe(index), describe(x), d, dim);
  }
  Tensor out = Tensor::empty(index.shape(), x.dtype(), x.device());
  const trace::Span span("gather", trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU:
      check_index_range("gather", index, dim, x);
      if (out.numel() > 0) cpu::gather(out, x, index, dim);
      return out;
    case kCUDA: cuda_index("gather", CudaIndexOp::kGather, out, x, index, index, dim); return out;
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor& index_add_(Tensor& x, int64_t dim, const Tensor& index, const Tensor& source) {
  dim = check_operands("index_add_", x, dim, index);
  check_addend("index_add_", x, source, "source");
  check_writable("index_add_", x);
  DTR_CHECK(index.dim() == 1, ValueError, "index_add_: index is {}; it must be 1-D", describe(index));
  Shape expected = x.shape();
  expected[dim] = index.numel();
  DTR_CHECK(source.shape() == expected, ValueError,
            "index_add_: source is {} but x is {} and index has {} entries; source must be {}{}", describe(source),
            describe(x), index.numel(), source.dtype(), expected);
  const trace::Span span("index_add_", trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU:
      check_index_range("index_add_", index, dim, x);
      if (source.numel() > 0) cpu::scatter_add(x, expand_along(index, dim, expected), source, dim);
      return x;
    case kCUDA:
      cuda_index("index_add_", CudaIndexOp::kScatterAdd, source, x,
                 source.numel() > 0 ? expand_along(index, dim, expected) : Tensor(), index, dim);
      return x;
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor& scatter_add_(Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  dim = check_operands("scatter_add_", x, dim, index);
  check_addend("scatter_add_", x, src, "src");
  check_writable("scatter_add_", x);
  DTR_CHECK(index.dim() == x.dim() && src.dim() == x.dim(), ValueError,
            "scatter_add_: x is {}, index is {} and src is {}; all three need the same number of dims", describe(x),
            describe(index), describe(src));
  for (int64_t d = 0; d < x.dim(); ++d) {
    DTR_CHECK(index.size(d) <= src.size(d) && (d == dim || index.size(d) <= x.size(d)), ValueError,
              "scatter_add_: index {} is larger than src {} or x {} in dim {}; index.size(d) <= src.size(d) is "
              "needed for every d, and index.size(d) <= x.size(d) for every d != {}",
              describe(index), describe(src), describe(x), d, dim);
  }
  const trace::Span span("scatter_add_", trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU:
      check_index_range("scatter_add_", index, dim, x);
      if (index.numel() > 0) cpu::scatter_add(x, index, src, dim);
      return x;
    case kCUDA: cuda_index("scatter_add_", CudaIndexOp::kScatterAdd, src, x, index, index, dim); return x;
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

}  // namespace dtr
