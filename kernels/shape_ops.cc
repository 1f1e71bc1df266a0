#include "kernels/shape_ops.h"

#include <algorithm>
#include <numeric>

#include "core/trace.h"
#include "kernels/cpu/shape_ops.h"

namespace dtr {

namespace {

// Checks cat's inputs against each other and returns the concatenated shape; wraps dim.
Shape cat_shape(const std::vector<Tensor>& tensors, int64_t& dim) {
  DTR_CHECK(!tensors.empty(), ValueError, "cat: expects a non-empty list of tensors");
  const Tensor& first = tensors[0];
  for (size_t i = 0; i < tensors.size(); ++i) {
    DTR_CHECK(tensors[i].defined(), ValueError, "cat: tensor {} is undefined", i);
    DTR_CHECK(tensors[i].dim() > 0, ValueError,
              "cat: tensor {} is 0-d ({}); zero-dimensional tensors cannot be concatenated", i, describe(tensors[i]));
  }
  dim = wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[dim] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    DTR_CHECK(t.dtype() == first.dtype(), TypeError,
              "cat: tensor {} is {} but tensor 0 is {}; all tensors need the same dtype (convert with .to({}))", i,
              describe(t), describe(first), first.dtype());
    DTR_CHECK(t.device() == first.device(), ValueError,
              "cat: tensor {} is on {} but tensor 0 is on {}; all tensors need the same device", i, t.device(),
              first.device());
    DTR_CHECK(t.dim() == first.dim(), ValueError,
              "cat: tensor {} is {} but tensor 0 is {}; all tensors need the same number of dims", i, describe(t),
              describe(first));
    for (int64_t d = 0; d < t.dim(); ++d) {
      DTR_CHECK(d == dim || t.size(d) == first.size(d), ValueError,
                "cat: tensor {} is {} but tensor 0 is {}; sizes must match except in dim {} (dim {} differs)", i,
                describe(t), describe(first), dim, d);
    }
    shape[dim] += t.size(dim);
  }
  return shape;
}

// Views of x along dim with the given sizes, which the caller has checked sum to x.size(dim).
std::vector<Tensor> views_with_sizes(const Tensor& x, std::span<const int64_t> sizes, int64_t dim) {
  std::vector<Tensor> views;
  views.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    views.push_back(x.narrow(dim, start, s));
    start += s;
  }
  return views;
}

// Wraps dim for split/chunk, which need at least one dim to cut.
int64_t cut_dim(const Tensor& x, int64_t dim, std::string_view op) {
  DTR_CHECK(x.dim() > 0, ValueError, "{}: {} is 0-d; it has no dim to cut", op, describe(x));
  return wrap_dim(dim, x.dim(), op);
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Shape shape = cat_shape(tensors, dim);
  Tensor out = Tensor::empty(std::move(shape), tensors[0].dtype(), tensors[0].device());
  return cat_out(out, tensors, dim);
}

Tensor& cat_out(Tensor& out, const std::vector<Tensor>& tensors, int64_t dim) {
  const Shape shape = cat_shape(tensors, dim);
  DTR_CHECK(out.defined() && out.shape() == shape && out.dtype() == tensors[0].dtype() &&
                out.device() == tensors[0].device() && out.is_contiguous(),
            ValueError, "cat_out: out is {}{}; it must be a contiguous {}{} tensor", describe(out),
            out.defined() && !out.is_contiguous() ? " (not contiguous)" : "", tensors[0].dtype(), shape);
  if (out.numel() == 0) return out;
  const trace::Span span("cat", trace::Category::kKernel);
  switch (out.device().type) {
    case kCPU: cpu::cat(out, tensors, dim); return out;
    case kCUDA: {  // each input is one strided device copy into its slice of out
      const int64_t d = wrap_dim(dim, out.dim(), "cat");
      int64_t at = 0;
      for (const Tensor& t : tensors) {
        Tensor piece = out.narrow(d, at, t.size(d));
        piece.copy_(t);
        at += t.size(d);
      }
      return out;
    }
  }
  DTR_INTERNAL_ASSERT(false, "unknown device type");
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  dim = cut_dim(x, dim, "split");
  const int64_t n = x.size(dim);
  DTR_CHECK(split_size > 0 || (split_size == 0 && n == 0), ValueError,
            "split: split_size {} is invalid for dim {} of {}; it must be positive (0 only for a size-0 dim)",
            split_size, dim, describe(x));
  if (n == 0) return {x};
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += split_size) sizes.push_back(std::min(split_size, n - start));
  return views_with_sizes(x, sizes, dim);
}

std::vector<Tensor> split(const Tensor& x, std::span<const int64_t> split_sizes, int64_t dim) {
  dim = cut_dim(x, dim, "split");
  const int64_t sum = std::accumulate(split_sizes.begin(), split_sizes.end(), int64_t{0});
  const bool non_negative = std::all_of(split_sizes.begin(), split_sizes.end(), [](int64_t s) { return s >= 0; });
  DTR_CHECK(non_negative && sum == x.size(dim), ValueError,
            "split: split_sizes {} (sum {}) do not cut dim {} of {}; they must be non-negative and sum to {}",
            std::vector(split_sizes.begin(), split_sizes.end()), sum, dim, describe(x), x.size(dim));
  return views_with_sizes(x, split_sizes, dim);
}

std::vector<int64_t> chunk_sizes(int64_t n, int64_t chunks) {
  DTR_CHECK(chunks > 0, ValueError, "chunk: chunks must be positive, got {}", chunks);
  DTR_CHECK(n >= 0, ValueError, "chunk: cannot chunk a negative size {}", n);
  const int64_t size = (n + chunks - 1) / chunks;
  std::vector<int64_t> sizes(chunks);
  for (int64_t r = 0; r < chunks; ++r) sizes[r] = std::clamp<int64_t>(n - r * size, 0, size);
  return sizes;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  dim = cut_dim(x, dim, "chunk");
  std::vector<int64_t> sizes = chunk_sizes(x.size(dim), chunks);
  if (x.size(dim) > 0) {
    while (sizes.back() == 0) sizes.pop_back();
  }
  return views_with_sizes(x, sizes, dim);
}

std::vector<Tensor> chunk_padded(const Tensor& x, int64_t chunks, int64_t dim) {
  dim = cut_dim(x, dim, "chunk_padded");
  return views_with_sizes(x, chunk_sizes(x.size(dim), chunks), dim);
}

}  // namespace dtr
