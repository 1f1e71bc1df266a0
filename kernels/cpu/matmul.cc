#include "kernels/cpu/matmul.h"

#include <Eigen/Core>

#include <optional>

#include "core/cpu/copy.h"
#include "core/parallel.h"
#include "kernels/cpu/elementwise.h"

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

// out[i] = a[i] b[i] for every batch i; a and b are float or double in Eigen-mappable layouts.
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
// contiguous transpose, so that the conversion reads and writes in order and the GEMM packs
// the operand as it would the float32 tensor (Eigen packs the two storage orders at
// different speeds).
Tensor to_float32(const Tensor& t) {
  const std::optional<MatrixLayout> l = matrix_layout(t);
  if (l && l->col_major && t.size(-2) > 1) {
    const Tensor tt = t.transpose(-2, -1);
    if (tt.is_contiguous()) return tt.to(kFloat32).transpose(-2, -1);
  }
  return t.to(kFloat32);
}

}  // namespace

void bmm(const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  if (a.dtype() == kBFloat16 || a.dtype() == kFloat16) {
    Tensor out_f32 = Tensor::empty(out.shape(), kFloat32);
    bmm(out_f32, to_float32(a), to_float32(b));
    copy(out, out_f32);  // rounds once
    return;
  }
  std::optional<MatrixLayout> la = matrix_layout(a), lb = matrix_layout(b);
  const Tensor ac = la ? a : a.contiguous();
  const Tensor bc = lb ? b : b.contiguous();
  if (!la) la = matrix_layout(ac);
  if (!lb) lb = matrix_layout(bc);
  switch (a.dtype()) {
    case kFloat32: batched_gemm<float>(ac, *la, bc, *lb, out); break;
    case kFloat64: batched_gemm<double>(ac, *la, bc, *lb, out); break;
    default: DTR_INTERNAL_ASSERT(false, "bmm kernel reached with dtype {}", a.dtype());
  }
}

void matmul_bias(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b, const Tensor& bias,
                 MatmulEpilogue epilogue) {
  if (out.numel() == 0) return;
  bmm(out.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0));
  add(out, out, bias, 1.0);  // bias [N] broadcast over the rows
  if (epilogue == MatmulEpilogue::kBias) return;
  if (pre.defined()) copy(pre, out);
  gelu(out, out, GeluApproximation::kTanh);
}

}  // namespace dtr::cpu
