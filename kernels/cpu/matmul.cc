#include "kernels/cpu/matmul.h"

#include <Eigen/Core>

#include <optional>

#include "core/cpu/copy.h"
#include "core/parallel.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"

namespace dtr::cpu {
namespace {

template <class T, int Order>
using ConstMap =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using RowMajorMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

// How the last two dims of an operand map into Eigen: storage order and leading dimension.
struct MatrixLayout {
  bool col_major;
  int64_t ld;
};

// Row-major (unit column stride) or column-major (unit row stride, a transposed view),
// each with any leading dimension that keeps rows (columns) apart; nothing else.
std::optional<MatrixLayout> matrix_layout(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const int64_t rs = t.stride(-2), cs = t.stride(-1);
  if ((cs == 1 || cols <= 1) && (rows <= 1 || rs >= cols)) {
    return MatrixLayout{false, rows <= 1 ? std::max<int64_t>(cols, 1) : rs};
  }
  if ((rs == 1 || rows <= 1) && (cols <= 1 || cs >= rows)) {
    return MatrixLayout{true, cols <= 1 ? std::max<int64_t>(rows, 1) : cs};
  }
  return std::nullopt;
}

// Calls f with an Eigen map of the rows x cols matrix at p in layout l.
template <class T, class F>
void with_map(const T* p, int64_t rows, int64_t cols, MatrixLayout l, F&& f) {
  if (l.col_major) {
    f(ConstMap<T, Eigen::ColMajor>(p, rows, cols, Eigen::OuterStride<>(l.ld)));
  } else {
    f(ConstMap<T, Eigen::RowMajor>(p, rows, cols, Eigen::OuterStride<>(l.ld)));
  }
}

// out[i] = a[i] b[i] for every batch i, on Eigen (float64; float32 and bfloat16 take dtr's GEMM).
template <class T>
void batched_gemm(const Tensor& a, MatrixLayout la, const Tensor& b, MatrixLayout lb, const Tensor& out) {
  const int64_t batch = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  const T* pa = a.data_ptr<T>();
  const T* pb = b.data_ptr<T>();
  T* pc = out.data_ptr<T>();
  auto gemm = [&](int64_t i) {
    RowMajorMap<T> c(pc + i * m * n, m, n);
    with_map(pa + i * a.stride(0), m, k, la, [&](const auto& lhs) {
      with_map(pb + i * b.stride(0), k, n, lb, [&](const auto& rhs) { c.noalias() = lhs * rhs; });
    });
  };
  Eigen::setNbThreads(num_threads());
  if (batch >= num_threads()) {
    // Threads take whole products; Eigen runs single-threaded inside a parallel region.
    parallel_for(batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) gemm(i);
    });
  } else {
    for (int64_t i = 0; i < batch; ++i) gemm(i);
  }
}

// t in float32 with t's layout kept: a transposed view (column-major) converts through its
// contiguous transpose, so that the conversion reads and writes in order and the GEMM reads
// the operand in place, as it would the float32 tensor.
Tensor to_float32(const Tensor& t) {
  const std::optional<MatrixLayout> l = matrix_layout(t);
  if (l && l->col_major && t.size(-2) > 1) {
    const Tensor tt = t.transpose(-2, -1);
    if (tt.is_contiguous()) return tt.to(kFloat32).transpose(-2, -1);
  }
  return t.to(kFloat32);
}

// x [B, R, C] as the GEMM reads it: x's layout l (row-major or transposed) and batch stride.
template <class T>
GemmMatrix<const T> gemm_matrix(const Tensor& x, MatrixLayout l) {
  return {.data = x.data_ptr<T>(),
          .row_stride = l.col_major ? 1 : l.ld,
          .col_stride = l.col_major ? l.ld : 1,
          .batch_stride = x.stride(0)};
}

// x itself where the GEMM can read it in place, else a contiguous copy; and its layout.
std::pair<Tensor, MatrixLayout> gemm_operand(const Tensor& x) {
  if (const std::optional<MatrixLayout> l = matrix_layout(x)) return {x, *l};
  const Tensor c = x.contiguous();
  return {c, *matrix_layout(c)};
}

// out [B, M, N] (contiguous float32) = options.alpha a b + options' beta and bias, for float32
// or bfloat16 operands in any layout (dtr's GEMM, kernels/cpu/gemm.h).
template <class T>
void gemm_into(const Tensor& out, const Tensor& a, const Tensor& b, const GemmOptions& options) {
  const auto [ac, la] = gemm_operand(a);
  const auto [bc, lb] = gemm_operand(b);
  const int64_t m = a.size(1), n = b.size(2);
  gemm(a.size(0), m, n, a.size(2), gemm_matrix<T>(ac, la), gemm_matrix<T>(bc, lb),
       GemmMatrix<float>{out.data_ptr<float>(), n, 1, m * n}, options);
}

}  // namespace

void bmm(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  switch (a.dtype()) {
    case kFloat32: gemm_into<float>(out, a, b, {}); return;
    case kBFloat16: {  // float32 accumulation, rounded once
      const Tensor out_f32 = Tensor::empty(out.shape(), kFloat32);
      gemm_into<BFloat16>(out_f32, a, b, {});
      copy(out, out_f32);
      return;
    }
    case kFloat16: {  // through float32, rounded once
      const Tensor out_f32 = Tensor::empty(out.shape(), kFloat32);
      gemm_into<float>(out_f32, to_float32(a), to_float32(b), {});
      copy(out, out_f32);
      return;
    }
    case kFloat64: {
      const auto [ac, la] = gemm_operand(a);
      const auto [bc, lb] = gemm_operand(b);
      batched_gemm<double>(ac, la, bc, lb, out);
      return;
    }
    default: DTR_INTERNAL_ASSERT(false, "bmm kernel reached with dtype {}", a.dtype());
  }
}

void matmul_accumulate(const Tensor& acc, const Tensor& a, const Tensor& b) {
  if (acc.numel() == 0) return;
  const Tensor acc3 = acc.unsqueeze(0);
  switch (a.dtype()) {
    case kFloat32: gemm_into<float>(acc3, a.unsqueeze(0), b.unsqueeze(0), {.beta = 1.0f}); return;
    case kBFloat16: gemm_into<BFloat16>(acc3, a.unsqueeze(0), b.unsqueeze(0), {.beta = 1.0f}); return;
    case kFloat16:
      gemm_into<float>(acc3, to_float32(a).unsqueeze(0), to_float32(b).unsqueeze(0), {.beta = 1.0f});
      return;
    case kFloat64: {
      const Tensor product = Tensor::empty(acc3.shape(), kFloat64);
      bmm(product, a.unsqueeze(0), b.unsqueeze(0));
      add(acc3, acc3, product, 1.0);
      return;
    }
    default: DTR_INTERNAL_ASSERT(false, "matmul_accumulate kernel reached with dtype {}", a.dtype());
  }
}

void matmul_bias(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b, const Tensor& bias,
                 MatmulEpilogue epilogue) {
  if (out.numel() == 0) return;
  if (a.dtype() == kFloat32) {
    // The bias as the GEMM's epilogue: the same roundings as the product, then add's pass.
    const Tensor bias_c = bias.contiguous();
    gemm_into<float>(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), {.bias = bias_c.data_ptr<float>()});
  } else {
    bmm(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0));
    add(out, out, bias, 1.0);  // bias [N] broadcast over the rows
  }
  if (epilogue == MatmulEpilogue::kBias) return;
  if (pre.defined()) copy(pre, out);
  gelu(out, out, GeluApproximation::kTanh);
}

}  // namespace dtr::cpu
