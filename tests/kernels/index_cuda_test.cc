// The CUDA indexing kernels (kernels/cuda/index.h) against the CPU kernels, bit for bit:
// index_select, gather, index_add_ and scatter_add_ in every dtype they take, int32 and
// int64 indices, along dims 0, 1 and the last of a 3-D x, with x, index and src/source
// contiguous, strided (every other element of the last dim) and transposed (reversed
// strides); repeated indices (the adds must come in index order: random values in bf16
// make any other order show), an index smaller than x and src larger than index, empty
// indices, and out-of-range indices: the CPU's IndexError message, and x left unchanged.
// Tagged gpu (Bazel) and [gpu] (Catch2): CPU-only runs leave it out.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/fill.h"
#include "kernels/index.h"
#include "tests/kernels/check_bitwise.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::check_bitwise;
using testing::random_index;

const Device kGpu(kCUDA, 0);

enum class Layout { kContiguous, kStrided, kTransposed };
constexpr Layout kLayouts[] = {Layout::kContiguous, Layout::kStrided, Layout::kTransposed};
const char* layout_name(Layout l) {
  return l == Layout::kContiguous ? "contiguous" : l == Layout::kStrided ? "strided" : "transposed";
}

// The values of the contiguous CPU tensor t, on `device`, held in `layout`.
Tensor in_layout(const Tensor& t, Layout layout, Device device) {
  switch (layout) {
    case Layout::kContiguous: return t.to(device);
    case Layout::kStrided: return testing::strided_copy(t.to(device));
    case Layout::kTransposed: {
      std::vector<int64_t> reversed(t.dim());
      for (int64_t d = 0; d < t.dim(); ++d) reversed[d] = t.dim() - 1 - d;
      return t.permute(reversed).contiguous().to(device).permute(reversed);
    }
  }
  return {};
}

// Values of dtype d: [-1, 1) for floats, integers in [-100, 100), mostly-true bools.
Tensor values(Shape shape, DType d, uint64_t seed) {
  return is_floating(d) ? testing::random_tensor(std::move(shape), d, seed)
                        : testing::random_tensor(std::move(shape), d, seed, -100, 100);
}

const Shape kShape = {6, 5, 4};

// kShape with dim's size replaced by k, and every other size shrunk by `shrink` (to >= 1).
Shape with_dim(int64_t dim, int64_t k, int64_t shrink = 0) {
  Shape s = kShape;
  for (int64_t d = 0; d < 3; ++d) s[d] = d == dim ? k : std::max<int64_t>(1, s[d] - shrink);
  return s;
}

TEST_CASE("CUDA index_select and gather equal the CPU's bit for bit", "[gpu]") {
  uint64_t seed = 1;
  for (DType d : testing::kAllDTypes) {
    for (DType index_dtype : {kInt32, kInt64}) {
      for (int64_t dim : {0, 1, 2}) {
        for (Layout layout : kLayouts) {
          const std::string what = fmt::format("{} x {} with {} index along dim {}", layout_name(layout), dtype_name(d),
                                               dtype_name(index_dtype), dim);
          INFO(what);
          const Tensor x = values(kShape, d, seed++);
          const int64_t n = kShape[dim], k = 2 * n + 1;  // more indices than rows: repeats
          const Tensor rows = random_index({k}, n, index_dtype, seed++);
          const Tensor xc = in_layout(x, layout, kCPU), xg = in_layout(x, layout, kGpu);
          const Tensor rc = in_layout(rows, layout, kCPU), rg = in_layout(rows, layout, kGpu);
          check_bitwise(index_select(xg, dim, rg), index_select(xc, dim, rc), "index_select " + what);
          const Tensor empty = Tensor::empty({0}, index_dtype);
          check_bitwise(index_select(xg, dim, empty.to(kGpu)), index_select(xc, dim, empty),
                        "index_select of no rows " + what);

          const Tensor picks = random_index(with_dim(dim, k, 1), n, index_dtype, seed++);  // smaller than x
          const Tensor pc = in_layout(picks, layout, kCPU), pg = in_layout(picks, layout, kGpu);
          check_bitwise(gather(xg, dim, pg), gather(xc, dim, pc), "gather " + what);
          const Tensor none = Tensor::empty(with_dim(dim, 0), index_dtype);
          check_bitwise(gather(xg, dim, none.to(kGpu)), gather(xc, dim, none), "gather of no indices " + what);
        }
      }
    }
  }
  // x empty in another dim than the index's: nothing to move, the indices still checked.
  const Tensor flat = zeros({0, 5}, kFloat32, kGpu);
  CHECK(index_select(flat, 1, Tensor::from_vector<int64_t>({4, 0}).to(kGpu)).shape() == Shape{0, 2});
  CHECK_THROWS_AS(index_select(flat, 1, Tensor::from_vector<int64_t>({5}).to(kGpu)), IndexError);
}

TEST_CASE("CUDA index_add_ and scatter_add_ equal the CPU's bit for bit, repeated indices in order", "[gpu]") {
  uint64_t seed = 1000;
  for (DType d : testing::kNumericDTypes) {
    for (DType index_dtype : {kInt32, kInt64}) {
      for (int64_t dim : {0, 1, 2}) {
        for (Layout layout : kLayouts) {
          const std::string what = fmt::format("{} operands, {} x, {} index along dim {}", layout_name(layout),
                                               dtype_name(d), dtype_name(index_dtype), dim);
          INFO(what);
          const Tensor x = values(kShape, d, seed++);
          const int64_t n = kShape[dim], k = 3 * n + 2;
          const Tensor rows = random_index({k}, n, index_dtype, seed++);
          const Tensor source = values(with_dim(dim, k), d, seed++);
          Tensor xc = in_layout(x, layout, kCPU), xg = in_layout(x, layout, kGpu);
          index_add_(xc, dim, in_layout(rows, layout, kCPU), in_layout(source, layout, kCPU));
          index_add_(xg, dim, in_layout(rows, layout, kGpu), in_layout(source, layout, kGpu));
          check_bitwise(xg, xc, "index_add_ " + what);
          index_add_(xg, dim, Tensor::empty({0}, index_dtype, kGpu), zeros(with_dim(dim, 0), d, kGpu));
          check_bitwise(xg, xc, "index_add_ of no rows " + what);

          // index smaller than x off dim, src larger than index everywhere: only src's
          // elements under index are read; several k of one slice position hit one row.
          const Shape index_shape = with_dim(dim, k, 1);
          Shape src_shape = index_shape;
          for (int64_t& s : src_shape) ++s;
          const Tensor index = random_index(index_shape, n, index_dtype, seed++);
          const Tensor src = values(src_shape, d, seed++);
          scatter_add_(xc, dim, in_layout(index, layout, kCPU), in_layout(src, layout, kCPU));
          scatter_add_(xg, dim, in_layout(index, layout, kGpu), in_layout(src, layout, kGpu));
          check_bitwise(xg, xc, "scatter_add_ " + what);
          scatter_add_(xg, dim, Tensor::empty(with_dim(dim, 0), index_dtype, kGpu), in_layout(src, layout, kGpu));
          check_bitwise(xg, xc, "scatter_add_ of no indices " + what);
        }
      }
    }
  }
}

TEST_CASE("CUDA index_add_ and scatter_add_ of many repeats of one row, at awkward sizes", "[gpu]") {
  for (DType d : {kFloat32, kBFloat16, kFloat16, kFloat64}) {
    for (int64_t k : {1, 7, 1023, 4097}) {
      const std::string what = fmt::format("{} with {} indices", dtype_name(d), k);
      INFO(what);
      const Tensor same = full({k}, 3.0, kInt64);
      const Tensor source = values({k, 257}, d, static_cast<uint64_t>(k));
      Tensor xc = zeros({10, 257}, d), xg = zeros({10, 257}, d, kGpu);
      index_add_(xc, 0, same, source);
      index_add_(xg, 0, same.to(kGpu), source.to(kGpu));
      check_bitwise(xg, xc, "index_add_ " + what);
      const Tensor index = random_index({k, 257}, 10, kInt32, static_cast<uint64_t>(k) + 1);
      scatter_add_(xc, 0, index, source);
      scatter_add_(xg, 0, index.to(kGpu), source.to(kGpu));
      check_bitwise(xg, xc, "scatter_add_ " + what);
      // Along the last dim: a thread per row walks 4097 indices.
      Tensor yc = zeros({3, 10}, d), yg = zeros({3, 10}, d, kGpu);
      const Tensor cols = values({3, k}, d, static_cast<uint64_t>(k) + 2);
      index_add_(yc, 1, same, cols);
      index_add_(yg, 1, same.to(kGpu), cols.to(kGpu));
      check_bitwise(yg, yc, "index_add_ along the last dim " + what);
    }
  }
}

// The message of the IndexError f(device) raises.
template <class F>
std::string index_error(F&& f, Device device) {
  try {
    f(device);
  } catch (const IndexError& e) {
    return e.what();
  }
  FAIL("no IndexError on " << fmt::format("{}", device));
  return {};
}

// `message` with every "float32[6, 5, 4]" (x described on the CPU) described on the GPU.
std::string on_gpu(std::string message, const Tensor& x) {
  const std::string cpu = describe(x.to(kCPU)), gpu = describe(x.to(kGpu));
  for (size_t at = message.find(cpu); at != std::string::npos; at = message.find(cpu, at + gpu.size())) {
    message.replace(at, cpu.size(), gpu);
  }
  return message;
}

TEST_CASE("CUDA indexing raises the CPU's IndexError for an index out of range, and writes nothing", "[gpu]") {
  for (DType index_dtype : {kInt32, kInt64}) {
    for (double bad : {-1.0, 5.0, 1e6}) {
      INFO(dtype_name(index_dtype) << " index holding " << bad);
      const Tensor x = values(kShape, kFloat32, 7);
      // One bad entry at row 2 (1-D) or position [1, 3, 2] (3-D), along dim 1 (size 5).
      Tensor rows = random_index({4}, 5, kInt64, 8);
      rows.data_ptr<int64_t>()[2] = static_cast<int64_t>(bad);
      rows = rows.to(index_dtype);
      Tensor picks = random_index({6, 7, 4}, 5, kInt64, 9);
      picks.data_ptr<int64_t>()[(1 * 7 + 3) * 4 + 2] = static_cast<int64_t>(bad);
      picks = picks.to(index_dtype);
      const Tensor source = values({6, 4, 4}, kFloat32, 10), src = values({6, 7, 4}, kFloat32, 11);

      const auto select = [&](Device dev) { index_select(x.to(dev), 1, rows.to(dev)); };
      const auto gathered = [&](Device dev) { gather(x.to(dev), 1, picks.to(dev)); };
      const std::string cpu_select = index_error(select, kCPU);
      CHECK_THAT(cpu_select, Catch::Contains("at position [2]") && Catch::Contains("dim 1 of size 5"));
      CHECK(index_error(select, kGpu) == on_gpu(cpu_select, x));
      const std::string cpu_gather = index_error(gathered, kCPU);
      CHECK_THAT(cpu_gather, Catch::Contains("at position [1, 3, 2]"));
      CHECK(index_error(gathered, kGpu) == on_gpu(cpu_gather, x));

      Tensor xg = x.to(kGpu);
      const auto add = [&](Device dev) {
        Tensor y = dev.is_cpu() ? x.clone() : xg;
        index_add_(y, 1, rows.to(dev), source.to(dev));
      };
      const auto scatter = [&](Device dev) {
        Tensor y = dev.is_cpu() ? x.clone() : xg;
        scatter_add_(y, 1, picks.to(dev), src.to(dev));
      };
      CHECK(index_error(add, kGpu) == on_gpu(index_error(add, kCPU), x));
      CHECK(index_error(scatter, kGpu) == on_gpu(index_error(scatter, kCPU), x));
      check_bitwise(xg, x, "x after the failed adds");
    }
  }
}

}  // namespace
}  // namespace dtr
