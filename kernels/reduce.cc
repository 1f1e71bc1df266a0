#include "kernels/reduce.h"

#include <algorithm>

#include "core/cuda/stream.h"
#include "core/trace.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce.h"

namespace dtr {
namespace {

void check_defined(std::string_view op, const Tensor& x) {
  DTR_CHECK(x.defined(), ValueError, "{}: the input is an undefined tensor", op);
}

// The max (or min, argmax) of nothing is undefined: reducing a dim of size 0 is an error.
void check_nonempty(std::string_view op, const Tensor& x, int64_t dim) {
  DTR_CHECK(x.size(dim) != 0, ValueError,
            "{}: cannot reduce dim {} of {}: it has size 0 and an empty set has no {} (sum gives 0 and mean NaN)", op,
            dim, describe(x), op);
}

// wrap_dim, with x named in the error.
int64_t wrap_dim_of(std::string_view op, int64_t dim, const Tensor& x) {
  try {
    return wrap_dim(dim, x.dim(), op);
  } catch (const IndexError& e) {
    throw IndexError(fmt::format("{} (input {})", e.what(), describe(x)));
  }
}

// Which dims of x the reduction covers (all of them for an empty list); a 0-d tensor has
// one slot so that dim 0 / -1 are accepted, as in torch.
std::vector<bool> reduced_dims(std::string_view op, const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<bool> reduced(std::max<int64_t>(x.dim(), 1), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim_of(op, d, x);
    DTR_CHECK(!reduced[w], ValueError, "{}: dim {} appears more than once in dims {} for {}", op, w, dims, describe(x));
    reduced[w] = true;
  }
  return reduced;
}

// x's elements as the CUDA reductions address them: the kept dims and the reduced ones.
cuda::ReduceLayout cuda_layout(std::string_view op, const Tensor& x, const std::vector<bool>& reduced) {
  DTR_CHECK(x.dim() <= cuda::kMaxMapDims, NotImplementedError, "{}: {} has {} dims; CUDA reductions take at most {}",
            op, describe(x), x.dim(), cuda::kMaxMapDims);
  cuda::ReduceLayout l;
  l.x_kept.data = x.numel() > 0 ? x.data() : nullptr;
  for (int64_t d = 0; d < x.dim(); ++d) {
    cuda::MapShape& shape = reduced[d] ? l.reduced : l.kept;
    cuda::MapOperand& strides = reduced[d] ? l.x_reduced : l.x_kept;
    shape.sizes[shape.ndim] = x.size(d);
    strides.strides[shape.ndim] = x.stride(d);
    ++shape.ndim;
    shape.numel *= x.size(d);
  }
  return l;
}

// out (contiguous, the keepdim shape) = op of x on its CUDA device.
void cuda_reduce(const Tensor& out, const Tensor& x, const std::vector<bool>& reduced, ReduceKind op) {
  const int device = x.device().index;
  cuda::reduce(out.data(), cuda_layout(reduce_kind_name(op), x, reduced), x.dtype(), op, device,
               cuda::current_stream(device).handle());
}

Tensor reduction(ReduceKind op, const Tensor& x, const std::vector<int64_t>& dims, KeepDim keepdim) {
  const std::string_view name = reduce_kind_name(op);
  check_defined(name, x);
  const std::vector<bool> reduced = reduced_dims(name, x, dims);
  Shape kept = x.shape(), squeezed;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!reduced[d]) {
      squeezed.push_back(x.size(d));
      continue;
    }
    if (op == ReduceKind::kMax || op == ReduceKind::kMin) check_nonempty(name, x, d);
    kept[d] = 1;
  }
  const bool integer_sum = op == ReduceKind::kSum && !is_floating(x.dtype());
  Tensor out = Tensor::empty(std::move(kept), integer_sum ? kInt64 : x.dtype(), x.device());
  const trace::Span span(name, trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU: cpu::reduce(out, x, op); break;
    case kCUDA: cuda_reduce(out, x, reduced, op); break;
  }
  return keepdim == KeepDim::kYes ? out : out.view(std::move(squeezed));
}

}  // namespace

DType sum_acc_dtype(DType x) { return x == kFloat32 || x == kFloat64 ? kFloat64 : kFloat32; }

void sum_rows_accumulate(const Tensor& acc, const Tensor& x) {
  constexpr std::string_view op = "sum_rows_accumulate";
  check_defined(op, x);
  DTR_CHECK(x.dim() == 2 && is_floating(x.dtype()), ValueError, "{}: x {} must be floating [R, C]", op, describe(x));
  const DType want = sum_acc_dtype(x.dtype());
  DTR_CHECK(acc.shape() == Shape{x.size(1)} && acc.is_contiguous() && acc.dtype() == want && acc.device() == x.device(),
            ValueError, "{}: acc {} must be a contiguous {} [{}] on {}, sum's accumulator for x {}", op, describe(acc),
            want, x.size(1), x.device(), describe(x));
  const trace::Span span(op, trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU: cpu::sum_rows_accumulate(acc, x); return;
    case kCUDA: {  // acc and x's rows summed in one reduction
      Tensor rows = Tensor::empty({x.size(0) + 1, x.size(1)}, want, x.device());
      rows.narrow(0, 0, 1).copy_(acc.view({1, x.size(1)}));
      rows.narrow(0, 1, x.size(0)).copy_(x);
      Tensor(acc).copy_(sum(rows, {0}));
      return;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, KeepDim keepdim) {
  return reduction(ReduceKind::kSum, x, dims, keepdim);
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, KeepDim keepdim) {
  return reduction(ReduceKind::kMean, x, dims, keepdim);
}
Tensor max(const Tensor& x, const std::vector<int64_t>& dims, KeepDim keepdim) {
  return reduction(ReduceKind::kMax, x, dims, keepdim);
}
Tensor min(const Tensor& x, const std::vector<int64_t>& dims, KeepDim keepdim) {
  return reduction(ReduceKind::kMin, x, dims, keepdim);
}
Tensor sum_of_squares(const Tensor& x, const std::vector<int64_t>& dims, KeepDim keepdim) {
  return reduction(ReduceKind::kSumOfSquares, x, dims, keepdim);
}

Tensor argmax(const Tensor& x, int64_t dim, KeepDim keepdim) {
  check_defined("argmax", x);
  // A 0-d tensor is argmax'd as its one-element 1-d view; the answer is 0, 0-d.
  const Tensor x1 = x.dim() == 0 ? x.unsqueeze(0) : x;
  const int64_t d = wrap_dim_of("argmax", dim, x);
  check_nonempty("argmax", x1, d);
  Shape kept = x1.shape(), squeezed = x1.shape();
  kept[d] = 1;
  squeezed.erase(squeezed.begin() + d);
  Tensor out = Tensor::empty(std::move(kept), kInt64, x.device());
  const trace::Span span("argmax", trace::Category::kKernel);
  switch (x.device().type) {
    case kCPU: cpu::argmax(out, x1, d); break;
    case kCUDA: {
      std::vector<bool> reduced(x1.dim(), false);
      reduced[d] = true;
      const int device = x.device().index;
      cuda::argmax(static_cast<int64_t*>(out.data()), cuda_layout("argmax", x1, reduced), x.dtype(), device,
                   cuda::current_stream(device).handle());
      break;
    }
  }
  if (x.dim() == 0) return out.view({});
  return keepdim == KeepDim::kYes ? out : out.view(std::move(squeezed));
}

}  // namespace dtr
